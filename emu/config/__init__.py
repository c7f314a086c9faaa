"""What a config says: validated models, no network and no processes.

- `experiment`: `Experiment`, one resolved run, and `Sections`, the hand-over of upper layers' models.
- `plan`: a config or sweep file expanded into experiments (grid, zip, seeds, repeats).
- `topospec`, `capacity`, `placement`: the topology, its capacity graph, where a server goes.
- `shaping`, `crosstraffic`, `faults`, `watchdog`: the sections that run over time.
- `dilation`: the experiment as the wall clock runs it under `time_dilation`.
- `yaml_input`, `errors`: bounded reading of user input, and pydantic's errors as one line.
"""
