"""Gradient-communication schedulers: what runs inside each worker and server role.

- `schedulers.core`: the `Scheduler` interface every scheduler implements, the link model, failures and progress.
- `schedulers.transport`: framed TCP between peers, with a priority outbox per connection and transmit stamps.
- `schedulers.ps`: the parameter-server family. Worker side (fifo, bytescheduler, p3, mercury) and the server process.
- `schedulers.collective`: the workers-only family. Ring, hierarchical, forest (and its planner), gloo.
- `schedulers.registry`: name -> class, for the worker, the server and config validation.

The data path: the trainer pushes a gradient -> a scheduler (ps/ or collective/) -> transport/ -> TCP -> the peer.
"""
