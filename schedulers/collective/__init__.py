"""The collective family: workers only, no server.

- `buckets`: DDP-style gradient buckets and the worker side ring and hierarchical share.
- `ring`, `hierarchical`: ring all-reduce, and reduce-in-group, ring among leaders, broadcast.
- `forest`, `forest_plan`, `forest_replan`, `bandwidth`: the forest, its planner, re-planning, probes.
- `gloo`: PyTorch's own all-reduce, the reference.
"""
