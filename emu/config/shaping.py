"""`shaping:` in a config: bandwidth schedules over time, and the rate changes they make.

A schedule is piecewise constant. Kinds:
- `steps`: [[t_s, mbps], ...];
- `square`: periodic high/low with a duty cycle;
- `onoff`: random ON/OFF periods, exponentially distributed, seeded;
- `mahimahi`: a Mahimahi trace (one integer millisecond per line, each one 1500-byte
  delivery opportunity), averaged over `window_ms` and looped like Mahimahi does;
- `csv`: rows of `t_s,mbps` (a header line is allowed), optionally looped.

A rate of 0 is an outage: it is allowed wherever the schedule is sure to come back
(periodic, random, traces, or a later step), and applied as htb's minimum rate (8 bit/s).
A `steps` schedule whose last rate is 0 would stall the run until its timeout, so it is
refused. The thread that applies the changes is emu/testbed/shaping.py.
"""
from __future__ import annotations

import csv
import hashlib
import io
import math
import os
import random
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from emu.config.topospec import MAX_MBPS, NodeName
from emu.config.yaml_input import InputError, decode, read_bounded, shown

Points = list[tuple[float, float]]  # (t_s, mbps), piecewise constant from each t

# Every change is one `tc class change` from the shaper's single thread, precomputed for the
# whole run (timeout_s): 100,000 changes are minutes of tc calls, more than it can apply on time.
MAX_RATE_CHANGES = 100_000
# Mahimahi's largest bundled trace (TMobile-LTE-driving.down) is 3.4 MB.
MAX_TRACE_BYTES = 8 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Steps(_Strict):
    kind: Literal["steps"] = Field(description="steps: piecewise-constant rates from given times on")
    steps: list[tuple[float, float]] = Field(
        min_length=1, description="[[t_s, mbps], ...]: from t_s seconds on, the rate is mbps Mb/s; times increase, "
                                  "the last rate is above 0")

    @field_validator("steps")
    @classmethod
    def _valid(cls, steps: Points) -> Points:
        for i, (t, r) in enumerate(steps):
            if t < 0 or r < 0:
                raise ValueError(f"[{i}]: time and rate must be >= 0")
            if r > MAX_MBPS:
                raise ValueError(f"[{i}]: {r:g} Mb/s is above the {MAX_MBPS} Mb/s a link can be configured to")
            if i and t <= steps[i - 1][0]:
                raise ValueError(f"[{i}]: times must increase ({t:g} after {steps[i - 1][0]:g})")
        if steps[-1][1] == 0:
            raise ValueError(f"[{len(steps) - 1}]: a final rate of 0 would stall the run until its timeout")
        return steps

    def points(self, horizon_s: float) -> Points:
        return [(t, r) for t, r in self.steps if t <= horizon_s]

    def changes(self, horizon_s: float) -> float:
        return sum(1 for t, _ in self.steps if t <= horizon_s)


class Square(_Strict):
    kind: Literal["square"] = Field(description="square: high and low rates in turn, periodic")
    period_s: float = Field(gt=0, description="length of one period, seconds")
    high_mbps: float = Field(gt=0, le=MAX_MBPS, description="rate of the high part, Mb/s")
    low_mbps: float = Field(ge=0, le=MAX_MBPS, description="rate of the low part, Mb/s (0: an outage)")
    duty: float = Field(default=0.5, gt=0, lt=1, description="fraction 0-1 of each period at high_mbps")

    def changes(self, horizon_s: float) -> float:
        return 2 * (horizon_s / self.period_s + 1)

    def points(self, horizon_s: float) -> Points:
        out, t = [], 0.0
        while t <= horizon_s:
            out += [(t, self.high_mbps), (t + self.duty * self.period_s, self.low_mbps)]
            t += self.period_s
        return [p for p in out if p[0] <= horizon_s]


class OnOff(_Strict):
    kind: Literal["onoff"] = Field(description="onoff: ON and OFF periods of random, exponentially distributed "
                                               "lengths")
    on_mbps: float = Field(gt=0, le=MAX_MBPS, description="rate while ON, Mb/s")
    off_mbps: float = Field(ge=0, le=MAX_MBPS, description="rate while OFF, Mb/s (0: an outage)")
    mean_on_s: float = Field(gt=0, description="mean length of an ON period, seconds")
    mean_off_s: float = Field(gt=0, description="mean length of an OFF period, seconds")
    seed: int = Field(default=0, description="integer seed of the periods' lengths")

    def changes(self, horizon_s: float) -> float:
        """The expected number (the periods are random)."""
        return 2 * horizon_s / (self.mean_on_s + self.mean_off_s) + 1

    def points(self, horizon_s: float) -> Points:
        rng = random.Random(self.seed)
        out, t, on = [], 0.0, True
        while t <= horizon_s:
            out.append((t, self.on_mbps if on else self.off_mbps))
            t += rng.expovariate(1 / (self.mean_on_s if on else self.mean_off_s))
            on = not on
        return out


class _TraceFile(_Strict):
    file: str = Field(description="the trace file (relative to the config file, or absolute)")
    _points: Points = PrivateAttr(default_factory=list)
    _period: float = PrivateAttr(default=0.0)
    sha256: str = Field(default="", description="set as the file is read: the start of its SHA-256, so the run id "
                                                "changes with the trace; a config leaves it out")

    @model_validator(mode="after")
    def _load(self, info: ValidationInfo) -> _TraceFile:
        base = Path((info.context or {}).get("base_dir", "."))
        path = Path(self.file) if Path(self.file).is_absolute() else base / self.file
        try:
            st = os.stat(path)
            key = (type(self), self.model_dump_json(exclude={"sha256"}), str(path), st.st_dev, st.st_ino,
                   st.st_size, st.st_mtime_ns)
        except (OSError, ValueError):
            key = None
        cache = (info.context or {}).get("traces")
        if cache is None or key is None:
            cache, key = {}, None
        hit = cache.get(key)
        if hit is None:
            try:
                data = read_bounded(path, MAX_TRACE_BYTES)
                text = decode(data, shown(path))
            except InputError as e:
                raise ValueError(f"file: cannot read {e.where}: {e.reason}") from None
            hit = (*self._parse(text), hashlib.sha256(data).hexdigest()[:16])
            if key is not None:
                cache[key] = hit
        pts, period, sha = hit
        object.__setattr__(self, "sha256", sha)
        self._points, self._period = pts, period
        return self

    def _parse(self, text: str) -> tuple[Points, float]:
        raise NotImplementedError

    def changes(self, horizon_s: float) -> float:
        n = sum(1 for t, _ in self._points if t <= horizon_s)
        return n if not self._period else len(self._points) * (horizon_s / self._period + 1)

    def points(self, horizon_s: float) -> Points:
        if not self._period:
            return [p for p in self._points if p[0] <= horizon_s]
        out, base = [], 0.0
        while base <= horizon_s:
            out += [(base + t, r) for t, r in self._points if base + t <= horizon_s]
            base += self._period
        return out


class Mahimahi(_TraceFile):
    kind: Literal["mahimahi"] = Field(description="mahimahi: a Mahimahi trace (a line per 1500-byte delivery "
                                                  "opportunity, its millisecond), looped")
    window_ms: int = Field(default=100, ge=1, description="averaging window of delivery opportunities, ms")

    def _parse(self, text: str) -> tuple[Points, float]:
        # One pass, counting opportunities per window as they come: a trace can have
        # millions of lines, and its windows are bounded before any list grows.
        counts: list[int] = []
        last = -1
        for n, line in enumerate(io.StringIO(text, newline=None), 1):
            line = line.strip()
            if not line:
                continue
            try:
                ms = int(line)
            except ValueError:
                raise ValueError(f"file: line {n}: {line[:20]!r} is not an integer millisecond") from None
            if ms < 0 or ms < last:
                raise ValueError(f"file: line {n}: timestamps must not decrease ({ms} after {last})"
                                 if last >= 0 else f"file: line {n}: negative timestamp")
            last = ms
            k = ms // self.window_ms
            if k >= len(counts):
                if k > MAX_RATE_CHANGES:
                    raise ValueError(f"file: line {n}: {ms} ms is window {k} of {self.window_ms} ms; a trace has "
                                     f"at most {MAX_RATE_CHANGES} windows (each a rate change): raise window_ms")
                counts.extend([0] * (k + 1 - len(counts)))
            counts[k] += 1
        if last < 0:
            raise ValueError("file: the trace is empty")
        period_ms = max(last, 1)
        nwin = math.ceil(period_ms / self.window_ms)
        if len(counts) > nwin:  # the stamps at the very end belong to the last window
            counts[nwin - 1] += sum(counts[nwin:])
            del counts[nwin:]
        counts.extend([0] * (nwin - len(counts)))
        per = 1500 * 8 / (self.window_ms / 1000) / 1e6  # Mb/s per opportunity per window
        k = max(range(nwin), key=counts.__getitem__)
        if counts[k] * per > MAX_MBPS:
            raise ValueError(f"file: window {k} ({k * self.window_ms} ms) has {counts[k]} delivery opportunities, "
                             f"{counts[k] * per:g} Mb/s; a link can be configured to at most {MAX_MBPS}")
        return [(k * self.window_ms / 1000, c * per) for k, c in enumerate(counts)], period_ms / 1000


class CsvTrace(_TraceFile):
    kind: Literal["csv"] = Field(description="csv: rows of t_s,mbps (a header line is allowed)")
    loop: bool = Field(default=False, description="start again after the last row (one step after it)")

    def _parse(self, text: str) -> tuple[Points, float]:
        pts: Points = []
        for n, row in enumerate(csv.reader(io.StringIO(text, newline=None)), 1):
            if not row or not "".join(row).strip():
                continue
            try:
                t, r = float(row[0]), float(row[1])
            except (ValueError, IndexError):
                if n == 1:
                    continue  # header
                raise ValueError(f"file: line {n}: expected t_s,mbps, got {','.join(row)[:40]!r}") from None
            if not (math.isfinite(t) and math.isfinite(r)):
                raise ValueError(f"file: line {n}: time and rate must be finite numbers")
            if t < 0 or r < 0:
                raise ValueError(f"file: line {n}: time and rate must be >= 0")
            if r > MAX_MBPS:
                raise ValueError(f"file: line {n}: {r:g} Mb/s is above the {MAX_MBPS} Mb/s a link can be "
                                 f"configured to")
            if len(pts) >= MAX_RATE_CHANGES:
                raise ValueError(f"file: line {n}: more than {MAX_RATE_CHANGES} rows (each is a rate change)")
            if pts and t <= pts[-1][0]:
                raise ValueError(f"file: line {n}: times must increase ({t:g} after {pts[-1][0]:g})")
            pts.append((t, r))
        if not pts:
            raise ValueError("file: the trace is empty")
        if not self.loop and pts[-1][1] == 0:
            raise ValueError("file: a final rate of 0 would stall the run until its timeout (or set loop: true)")
        period = 0.0
        if self.loop:
            step = pts[-1][0] - pts[-2][0] if len(pts) > 1 else 1.0
            period = pts[-1][0] + step
        return pts, period


Schedule = Annotated[Steps | Square | OnOff | Mahimahi | CsvTrace, Field(discriminator="kind")]


class LinkShaping(_Strict):
    link: tuple[NodeName, NodeName] = Field(description="direction: traffic from the first to the second")
    schedule: Schedule = Field(description="the direction's rate over time, of one of five kinds")



def schedule_events(shaping: list[LinkShaping], horizon_s: float, dilation: float = 1.0
                    ) -> list[tuple[float, tuple[str, str], float]]:
    """Every rate change of every schedule up to `horizon_s` (emulated seconds), in time order:
    (t, link direction, bit/s). With time dilation k (emu/config/dilation.py) the times are k times
    later and the rates k times lower: the schedule as the wall clock runs it."""
    k = dilation
    return sorted((t * k, tuple(s.link), r * 1e6 / k) for s in shaping for t, r in s.schedule.points(horizon_s))
