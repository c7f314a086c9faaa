"""DDP-style gradient buckets, shared by the collectives that fuse gradients (ring, gloo).

One collective per parameter would pay its fixed cost hundreds of times per iteration, and
one for the whole model could start only after backward ends. So, as PyTorch DDP does,
gradients are fused into flat buckets of about `bucket_mb`, filled in the order backward is
expected to produce them (the layer farthest from the input first), with a smaller first
bucket so that communication starts early. Every worker computes the same buckets from the
same tensor list, and a bucket is ready once its last gradient has been pushed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import Field

from schedulers.base import SchedulerParams, TensorSpec

MiB = 1024 * 1024


class BucketParams(SchedulerParams):
    """The bucket caps (DDP's defaults). Bucketing collectives run among the workers alone."""

    requires_servers: ClassVar[bool] = False
    bucket_mb: float = Field(default=25.0, gt=0, le=1_048_576, description="bucket cap in MiB (DDP's bucket_cap_mb)")
    first_bucket_mb: float = Field(default=1.0, gt=0, le=1_048_576, description="cap of the first bucket in MiB (DDP)")


@dataclass
class Bucket:
    """Gradients fused into one flat buffer; `offsets[key]` is where each one starts."""

    index: int
    keys: list[int]
    offsets: dict[int, int]
    numel: int
    sizes: dict[int, int] = field(default_factory=dict)   # key -> its number of elements

    def span(self, key: int) -> slice:
        """Where gradient `key` lies in the bucket's buffer."""
        return slice(self.offsets[key], self.offsets[key] + self.sizes[key])


def assign_buckets(tensors: list[TensorSpec], cap_bytes: int, first_cap_bytes: int) -> list[Bucket]:
    """DDP's rule over the expected readiness order: add tensors to the current bucket until
    it reaches its cap (a tensor larger than the cap gets a bucket of its own)."""
    order = sorted(tensors, key=lambda t: (-t.priority, -t.key))  # backward: output side first
    buckets: list[Bucket] = []
    keys: list[int] = []
    offsets: dict[int, int] = {}
    numel = 0
    for t in order:
        keys.append(t.key)
        offsets[t.key] = numel
        numel += t.numel
        if numel * 4 >= (first_cap_bytes if not buckets else cap_bytes):
            buckets.append(Bucket(len(buckets), keys, offsets, numel))
            keys, offsets, numel = [], {}, 0
    if keys:
        buckets.append(Bucket(len(buckets), keys, offsets, numel))
    sizes = {t.key: t.numel for t in tensors}
    for b in buckets:
        b.sizes = {k: sizes[k] for k in b.keys}
    return buckets


def plan_buckets(tensors: list[TensorSpec], params: BucketParams) -> list[Bucket]:
    """The buckets for a scheduler's caps."""
    return assign_buckets(tensors, int(params.bucket_mb * MiB), int(params.first_bucket_mb * MiB))


@dataclass(eq=False, kw_only=True)
class BucketState:
    """One bucket at this worker: the gradients pushed for its next launch, and which
    iteration was last launched and last completed. A bucket's buffers serve one launch
    at a time: a gradient is copied in only once `done_it == launched_it`."""

    spec: Bucket
    filled: int = 0                # gradients pushed for the next launch...
    filling_it: int = -1           # ...which is of this iteration
    launched_it: int = -1
    done_it: int = -1

    def add(self) -> bool:
        """One more gradient of `filling_it` is in; True, and the count starts over, when it
        was the last one (caller holds the scheduler's lock)."""
        self.filled += 1
        if self.filled < len(self.spec.keys):
            return False
        self.filled = 0
        return True
