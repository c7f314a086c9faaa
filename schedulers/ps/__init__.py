"""The parameter-server family.

- `client`: the worker side every member shares (connections to servers, outboxes, slots).
- `fifo`, `bytescheduler`, `p3`, `mercury`: the members.
- `server`: the server process of the whole family (its process: `python -m workloads.server SPEC.json`).
"""
