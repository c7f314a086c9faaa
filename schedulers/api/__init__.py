"""The interface for scheduler authors: everything a scheduler needs, from one stable place.

    from schedulers.api import Scheduler, SchedulerParams, TensorSpec, RoleContext, Endpoint, CommError

The built-in schedulers import it from here too, so a plugin (a file or package named in a
config's `plugins:`, or an installed package's `schedlab.schedulers` entry point; see
schedulers/registry/plugins.py) sees exactly what they see. What is here is the whole contract;
the rest of schedulers/ may change.

What each is:

- `Scheduler`: the base class. Implement, all four called by the worker's training loop:
    start(tensors)        tensors: a TensorSpec per parameter; connect to the peers here
    push(key, grad, it)   non-blocking: the gradient of `key` for iteration `it` is ready
                          (flat float32 numpy; yours until that iteration's result is back)
    wait(key, it) -> arr  block until the average over all workers of `key` for `it` is in
    close()               finish, tell the peers, leave no thread or socket behind
  Optional: `info()` (a dict kept as the run's scheduler_info.json), `tables()`, and
  `self.event(what, key, chunk, it)` for tracing. The constructor is `(ctx, params)`.
- `SchedulerParams`: the base of the scheduler's `Params` (its config section
  `schedulers.<name>:`, unknown keys refused). Class flag `requires_servers`: False for a
  collective (workers only); True makes it a parameter-server scheduler, which then also needs
  a `server_mode` class attribute (a `schedulers.api.transport.Mode`: the built-in server's).
- `TensorSpec(key, name, numel, priority)`: one parameter; priority 0 is nearest the input.
- `RoleContext`: rank, num_workers, servers and workers (`Endpoint`s; worker i listens for its
  peers at workers[i].ip:workers[i].port), topology (capacity graph as networkx node-link
  data, bit/s, or None on loopback), connect_timeout_s, iface, trace.
- `Endpoint(host, ip, port)`: where a role listens.
- `CommError`: raise it, naming the peer, when a peer fails or closes.

Class attributes to declare (what reports, bounds, plots and `./inv tune` know of it):
`name` (the registry name, the config's `scheduler:`), `Params`, `family` ("collective" or
"parameter_server"), `bound_model` (one of `BOUND_MODELS`: "parameter_server",
"ring_allreduce", "tree_packing", "hierarchical_allreduce", "cut", or "none": no bound fits,
and analysis then leaves bound and efficiency empty), `display_order` (its place and colour in
figures; a collision with another scheduler's is resolved by analysis), optionally
`display_name` and `tuning` (a tuple of `TuneDim`: its search space for ./inv tune).

Transport: `schedulers.api.transport` re-exports the framed TCP connection, the priority
outbox and the peer set-up helpers (`dial`, `Acceptor`, `Hello`) the built-ins use; a
scheduler with its own sockets works just as well.
"""
from __future__ import annotations

from contracts.scheduler_info import BOUND_MODELS, BoundModel, Family, TuneDim
from schedulers.core.base import CommError, Endpoint, RoleContext, Scheduler, SchedulerParams, TensorSpec

__all__ = ["BOUND_MODELS", "BoundModel", "CommError", "Endpoint", "Family", "RoleContext", "Scheduler",
           "SchedulerParams", "TensorSpec", "TuneDim"]
