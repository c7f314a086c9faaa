"""What every scheduler shares: the interface and the models beneath both families.

- `base`: `Scheduler`, `SchedulerParams`, `TensorSpec`, `RoleContext`, `CommError`.
- `linkmodel`: `LinkModel`, links with capacities and the links each worker pair's path crosses.
- `failure`: a role's first failure, shared by its threads.
- `progress`: the thread that rewrites a role's progress report for the watchdog.
"""
