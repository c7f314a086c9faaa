"""One experiment, from network up to its row in `runs.parquet`.

- `runner`: `run_one`, the path of one run.
- `watchdog`, `faults`: stalls found and named, faults applied and undone on the run's timeline.
- `results`: `runs.parquet` and the per-run tables, written atomically.
"""
