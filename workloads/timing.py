"""One iteration's timeline, layer by layer: measured by the real trainer, recorded by the
profiler, played back by replay mode, and written by the worker as per-layer rows.

Definitions (the same in every mode, so a replayed run can be compared with its profile):
- a layer's wait: time blocked in `Scheduler.wait` for its gradients of the previous iteration;
- a layer's forward: from the end of its wait to the next layer's pre-hook (the last layer:
  to the start of backward), so its SGD update and the parameterless ops after it count;
- a tensor's gap: from the previous gradient (or the start of backward) to its own, and a
  layer's backward is the sum of its tensors' gaps;
- lead: step start to the first layer; tail: last gradient to the end of backward.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class StepResult(NamedTuple):
    loss: float
    accuracy: float


@dataclass
class Timing:
    lead_s: float = 0.0
    wait_s: list[float] = field(default_factory=list)        # per layer, forward order
    forward_s: list[float] = field(default_factory=list)     # per layer
    backward_s: list[float] = field(default_factory=list)    # per layer
    ready: list[tuple[int, float]] = field(default_factory=list)  # (key, gap before it), backward order
    tail_s: float = 0.0

    def rows(self, rank: int, iteration: int, layer_names: list[str]) -> list[dict]:
        """Per-layer records of this iteration (the worker's `layers` list)."""
        return [{"rank": rank, "iteration": iteration, "layer": i, "name": name,
                 "wait_s": self.wait_s[i], "forward_s": self.forward_s[i], "backward_s": self.backward_s[i]}
                for i, name in enumerate(layer_names)]


@dataclass
class Aggregates:
    """Per iteration, what happened to its own aggregated gradients: the time blocked waiting
    for them, per layer, and the moment the last was applied. They are waited for in the next
    iteration's forward pass (and after the loop for the last), so a step's `Timing` sees the
    previous iteration's; these are what the iteration's time includes
    (contracts/iterations.py)."""
    num_layers: int = 0
    wait_s: list[list[float]] = field(default_factory=list)   # [iteration][layer]
    applied_at: list[float] = field(default_factory=list)     # [iteration], the trainer's clock

    def applied(self, iteration: int, layer: int, waited_s: float, now: float) -> None:
        while len(self.applied_at) <= iteration:
            self.wait_s.append([0.0] * self.num_layers)
            self.applied_at.append(now)
        self.wait_s[iteration][layer] += waited_s
        self.applied_at[iteration] = max(self.applied_at[iteration], now)
