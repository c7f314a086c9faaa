"""`cross_traffic:` in a config: iperf3 flows between hosts that compete with the training's traffic.

A flow runs from `src` to `dst` over TCP or UDP, from `start_s` to `stop_s` after the roles
start (or to the end of the run), optionally capped at `rate_mbps`. The processes are
started by emu/testbed/crosstraffic.py.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from emu.config.topospec import MAX_MBPS, NodeName


class Flow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    src: NodeName = Field(description="the sending host")
    dst: NodeName = Field(description="the receiving host")
    protocol: Literal["tcp", "udp"] = Field(default="tcp", description="iperf3 over TCP or UDP")
    rate_mbps: float | None = Field(default=None, gt=0, le=MAX_MBPS, description="cap, Mb/s; UDP needs one")
    start_s: float = Field(default=0, ge=0, description="start, seconds after the roles start")
    stop_s: float | None = Field(default=None, gt=0,
                                 description="stop, seconds after the roles start (unset: at the end of the run)")
    parallel: int = Field(default=1, ge=1, le=32, description="count of parallel streams (iperf3 -P)")

    @model_validator(mode="after")
    def _valid(self) -> Flow:
        if self.src == self.dst:
            raise ValueError("dst: a flow needs two different hosts")
        if self.protocol == "udp" and self.rate_mbps is None:
            raise ValueError("rate_mbps: a UDP flow needs a rate (iperf3 would send 1 Mb/s)")
        if self.stop_s is not None and self.stop_s <= self.start_s:
            raise ValueError("stop_s: must be after start_s")
        return self
