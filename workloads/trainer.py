"""Layer-wise data-parallel training on top of a `Scheduler`.

Two hooks make priority scheduling matter:
- each parameter's post-accumulate-grad hook hands its gradient to `Scheduler.push` the
  moment backward has produced it (the last layer first);
- each layer's forward pre-hook blocks on `Scheduler.wait` for its parameters' averaged
  gradients of the previous iteration and applies the update just in time, so the next
  forward pass can start on layer 0 while later layers are still being communicated.

The update is SGD with momentum and weight decay, per parameter, exactly as
`torch.optim.SGD` computes it (dampening 0, no Nesterov).
"""
from __future__ import annotations

import time

import torch
from torch import nn

from schedulers.base import Scheduler, TensorSpec


class LayerwiseSGD:
    def __init__(self, model: nn.Module, scheduler: Scheduler, lr: float, momentum: float,
                 weight_decay: float):
        self.model = model
        self.sched = scheduler
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.names = {id(p): n for n, p in model.named_parameters()}
        self.layers = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
        self.layer_params = {id(m): [p for p in m.parameters(recurse=False) if p.requires_grad]
                             for m in self.layers}
        self.key = {}                 # id(param) -> key, assigned in forward execution order
        self.momentum_buf: dict[int, torch.Tensor] = {}
        self.it = 0                   # the iteration whose backward pushes gradients
        self.wait_s = 0.0             # time blocked in Scheduler.wait, accumulated
        self.started = False
        self._forward_order: list[nn.Module] = []
        for m in self.layers:
            m.register_forward_pre_hook(self._before_layer)
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    # ------------------------------------------------------------------ hooks
    def _before_layer(self, module: nn.Module, _inputs) -> None:
        if not self.started:
            self._forward_order.append(module)
            return
        if self.it == 0:
            return
        for p in self.layer_params[id(module)]:
            self._apply(p, self.it - 1)

    def _grad_ready(self, p: torch.Tensor) -> None:
        grad = p.grad
        p.grad = None  # the scheduler now owns this buffer; autograd allocates a new one
        self.sched.push(self.key[id(p)], grad.detach().numpy().reshape(-1), self.it)

    # ------------------------------------------------------------------ update
    def _apply(self, p: torch.Tensor, it: int) -> None:
        t0 = time.perf_counter()
        avg = self.sched.wait(self.key[id(p)], it)
        self.wait_s += time.perf_counter() - t0
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
        """Priorities from the forward order just observed: 0 = the layer nearest the input."""
        specs = []
        for prio, m in enumerate(self._forward_order):
            for p in self.layer_params[id(m)]:
                if id(p) in self.key:
                    continue  # a layer called twice keeps its first position
                self.key[id(p)] = len(specs)
                specs.append(TensorSpec(key=len(specs), name=self.names[id(p)], numel=p.numel(), priority=prio))
        missing = [self.names[id(p)] for p in self.params if id(p) not in self.key]
        if missing:
            raise RuntimeError(f"parameters not used in forward: {missing}")
        self.tensors = specs
        self.sched.start(specs)
        self.started = True

    # ------------------------------------------------------------------ loop
    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        out = self.model(x)
        if not self.started:
            self._start()
        loss = nn.functional.cross_entropy(out, y)
        loss.backward()
        self.it += 1
        return float(loss.detach())

    def finish(self) -> None:
        """Wait for and apply the last iteration's gradients, so all replicas end equal."""
        if self.it:
            for p in self.params:
                self._apply(p, self.it - 1)
