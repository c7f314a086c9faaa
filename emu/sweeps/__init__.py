"""Many experiments.

- `sweep`: a plan's runs on this machine, skipping completed ones, with progress.
- `raysweep`: the same plan as Ray tasks, one emulated network per node.
- `tune`: Bayesian optimisation of a scheduler's tunables, one network setting at a time.
"""
