"""The orchestrator: a config becomes a run on an emulated network, and runs become a sweep.

- `emu.config`: what a config says. Pydantic models, validated in full before anything starts.
- `emu.testbed`: the kernel and the network. Mininet, tc, netlink, cgroups, settings, monitors, cleanup records.
- `emu.run`: one experiment. Network up, roles launched, the watchdog and faults, records collected, the row written.
- `emu.sweeps`: many experiments. A plan run on this machine or on Ray, and the tuning of scheduler tunables.

Each package imports only those above it in this list (tests/unit/test_layers.py).
"""
