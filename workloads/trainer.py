"""Layer-wise data-parallel training on top of a `Scheduler`.

Two hooks make priority scheduling matter:
- each parameter's post-accumulate-grad hook hands its gradient to `Scheduler.push` the
  moment backward has produced it (the last layer first);
- each layer's forward pre-hook blocks on `Scheduler.wait` for its parameters' averaged
  gradients of the previous iteration and applies the update just in time, so the next
  forward pass can start on layer 0 while later layers are still being communicated.

A *layer* is the module at whose pre-hook a parameter is waited for: the first module
called in the forward pass that owns it (a tied weight waits at its first use), or, for a
parameter whose owner is never called (nn.MultiheadAttention reads `out_proj.weight`
without calling `out_proj`), the nearest called ancestor. Priorities are the layers'
positions in the observed forward order, 0 nearest the input. A module called several
times per forward waits once, at its first call.

The update is SGD with momentum and weight decay, per parameter, exactly as
`torch.optim.SGD` computes it (dampening 0, no Nesterov). Only parameters are
synchronised, never buffers: the zoo has no BatchNorm (see models.py).

Per iteration the trainer also times each layer (`timing`, defined in timing.py): its
wait, forward and backward; the profiler and replay mode use the same definitions.
"""
from __future__ import annotations

import hashlib
import time

import torch
from torch import nn

from schedulers.core.base import Scheduler, TensorSpec
from workloads.timing import Aggregates, StepResult, Timing


class LayerwiseSGD:
    def __init__(self, model: nn.Module, scheduler: Scheduler, lr: float, momentum: float,
                 weight_decay: float, clock=time.perf_counter):
        """`clock` times the layers: wall time in runs; the profiler may pass thread CPU time."""
        self.model = model
        self.clock = clock
        self.sched = scheduler
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.names = {id(p): n for n, p in model.named_parameters()}
        # Who owns each parameter, and each module's parents (a shared module has several).
        self._owners: dict[int, list[nn.Module]] = {id(p): [] for p in self.params}
        self._parents: dict[int, list[nn.Module]] = {}
        for _, m in model.named_modules(remove_duplicate=False):
            for p in m.parameters(recurse=False):
                if id(p) in self._owners and m not in self._owners[id(p)]:
                    self._owners[id(p)].append(m)
            for child in m.children():
                self._parents.setdefault(id(child), []).append(m)
        self.key: dict[int, int] = {}       # id(param) -> key, assigned in forward order
        self.layer_of: dict[int, int] = {}  # id(module) -> layer index, for modules that wait
        self.layer_names: list[str] = []
        self.layer_params: list[list[nn.Parameter]] = []
        self.tensors: list[TensorSpec] = []
        self.momentum_buf: dict[int, torch.Tensor] = {}
        self.it = 0                   # the iteration whose backward pushes gradients
        self.wait_s = 0.0             # time blocked in Scheduler.wait, accumulated
        self.started = False
        self.timing = Timing()
        self.aggregates = Aggregates()  # per iteration: its own aggregates' waits and when applied
        self._first_calls: list[tuple[nn.Module, float]] = []   # the first forward, in call order
        self._seen: set[int] = set()
        self._paused = False
        self._entered: list[float | None] = []   # per layer: time of its pre-hook this iteration
        self._marks: list[int] = []       # layers in the order they were entered this iteration
        self._pushed = 0
        for m in model.modules():
            m.register_forward_pre_hook(self._before_module)
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    # ------------------------------------------------------------------ hooks
    def _before_module(self, module: nn.Module, _inputs) -> None:
        now = self.clock()
        if self._paused:
            return
        if not self.started:
            if id(module) not in self._seen:
                self._seen.add(id(module))
                self._first_calls.append((module, now))
            return
        layer = self.layer_of.get(id(module))
        if layer is not None and self._entered[layer] is None:
            self._enter(layer, now)

    def _enter(self, layer: int, now: float) -> None:
        self._entered[layer] = now
        self._marks.append(layer)
        if self.it > 0:
            for p in self.layer_params[layer]:
                self._apply(p, self.it - 1, layer)

    def _grad_ready(self, p: torch.Tensor) -> None:
        now = self.clock()
        key = self.key[id(p)]
        self.timing.ready.append((key, now - self._last_ready))
        self._last_ready = now
        grad = p.grad
        p.grad = None  # the scheduler now owns this buffer; autograd allocates a new one
        self._pushed += 1
        self.sched.push(key, grad.detach().numpy().reshape(-1), self.it)

    # ------------------------------------------------------------------ update
    def _apply(self, p: torch.Tensor, it: int, layer: int) -> None:
        t0 = self.clock()
        avg = self.sched.wait(self.key[id(p)], it)
        dt = self.clock() - t0
        self.wait_s += dt
        self.timing.wait_s[layer] += dt
        self._update(p, avg)
        self.aggregates.applied(it, layer, dt, self.clock())

    def _update(self, p: torch.Tensor, avg) -> None:
        with torch.no_grad():
            d_p = torch.from_numpy(avg).view_as(p)
            if self.weight_decay:
                d_p = d_p.add(p, alpha=self.weight_decay)
            if self.momentum:
                buf = self.momentum_buf.get(id(p))
                if buf is None:
                    buf = self.momentum_buf[id(p)] = d_p.clone()
                else:
                    buf.mul_(self.momentum).add_(d_p)
                d_p = buf
            p.add_(d_p, alpha=-self.lr)

    def _start(self) -> None:
        """Layers, keys and priorities from the forward order just observed."""
        position = {id(m): i for i, (m, _) in enumerate(self._first_calls)}
        assigned: dict[int, list[nn.Parameter]] = {}   # id(module) -> params waited for there
        for p in self.params:
            m = self._waiting_module(p, position)
            assigned.setdefault(id(m), []).append(p)
        named = {id(m): n for n, m in self.model.named_modules()}
        for m, _ in self._first_calls:   # forward order
            if id(m) not in assigned:
                continue
            self.layer_of[id(m)] = len(self.layer_names)
            self.layer_names.append(named[id(m)] or "(model)")
            self.layer_params.append(assigned[id(m)])
        for prio, params in enumerate(self.layer_params):
            for p in params:
                self.key[id(p)] = len(self.tensors)
                self.tensors.append(TensorSpec(key=len(self.tensors), name=self.names[id(p)],
                                               numel=p.numel(), priority=prio))
        self.sched.start(self.tensors)
        self.aggregates = Aggregates(num_layers=len(self.layer_names))
        self.started = True

    def _waiting_module(self, p: nn.Parameter, position: dict[int, int]) -> nn.Module:
        """The first-called owner of `p`, else its nearest called ancestor (the model itself
        is always called)."""
        level = self._owners[id(p)]
        while level:
            called = [m for m in level if id(m) in position]
            if called:
                return min(called, key=lambda m: position[id(m)])
            level = [q for m in level for q in self._parents.get(id(m), [])]
        raise RuntimeError(f"parameter {self.names[id(p)]} is not reachable from the model")

    # ------------------------------------------------------------------ loop
    def step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> StepResult:
        x, y = batch
        n = len(self.layer_names)
        self.timing = Timing(wait_s=[0.0] * n)
        self._entered, self._marks, self._pushed = [None] * n, [], 0
        t_start = self.clock()
        out = self.model(x)
        if not self.started:
            self._start()
            self.timing.wait_s = [0.0] * len(self.layer_names)
            self._entered = [None] * len(self.layer_names)
            for m, t in self._first_calls:
                if id(m) in self.layer_of:
                    self._entered[self.layer_of[id(m)]] = t
                    self._marks.append(self.layer_of[id(m)])
        else:
            # A layer that this forward did not call (data-dependent control flow) is still
            # brought up to date, so every replica applies every iteration's update.
            for layer, t in enumerate(self._entered):
                if t is None:
                    self._enter(layer, self.clock())
        loss = nn.functional.cross_entropy(out, y)
        with torch.no_grad():
            accuracy = float((out.argmax(-1) == y).float().mean())
        t_backward = self._last_ready = self.clock()
        loss.backward()
        t_end = self.clock()
        if self._pushed != len(self.params):
            got = {k for k, _ in self.timing.ready}
            missing = [t.name for t in self.tensors if t.key not in got]
            raise RuntimeError(f"iteration {self.it}: no gradient for {missing}; every parameter must "
                               f"take part in every forward pass")
        self._close_timing(t_start, t_backward, t_end)
        self.it += 1
        return StepResult(float(loss.detach()), accuracy)

    def _close_timing(self, t_start: float, t_backward: float, t_end: float) -> None:
        tm = self.timing
        marks = self._marks
        ends = [self._entered[m] for m in marks[1:]] + [t_backward]
        tm.forward_s = [0.0] * len(self.layer_names)
        for layer, end in zip(marks, ends):
            tm.forward_s[layer] = end - self._entered[layer] - tm.wait_s[layer]
        tm.lead_s = self._entered[marks[0]] - t_start if marks else 0.0
        tm.backward_s = [0.0] * len(self.layer_names)
        for key, gap in tm.ready:
            tm.backward_s[self.tensors[key].priority] += gap
        tm.tail_s = t_end - self._last_ready

    def finish(self) -> None:
        """Wait for and apply the last iteration's gradients, so all replicas end equal (the
        moment the last is applied ends the last iteration)."""
        if self.it:
            self.timing = Timing(wait_s=[0.0] * len(self.layer_names))
            for layer, params in enumerate(self.layer_params):
                for p in params:
                    self._apply(p, self.it - 1, layer)

    @torch.no_grad()
    def evaluate(self, batch: tuple[torch.Tensor, torch.Tensor]) -> StepResult:
        """Loss and accuracy on a held-out batch, without hooks (call after `finish`)."""
        x, y = batch
        self._paused = True
        try:
            out = self.model(x)
        finally:
            self._paused = False
        return StepResult(float(nn.functional.cross_entropy(out, y)), float((out.argmax(-1) == y).float().mean()))

    def checksum(self) -> str:
        h = hashlib.sha256()
        for p in self.model.parameters():
            h.update(p.detach().numpy().tobytes())
        return h.hexdigest()[:16]
