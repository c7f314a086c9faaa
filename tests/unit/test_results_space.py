"""A results directory that cannot take a write is one ResultsError naming the path and the cause,
with no temporary file left (emu/run/results.py); a run's size is estimated before the sweep
(emu/config/footprint.py) and compared with the free space (emu/sweeps/space.py). The full,
read-only and removed directories of real sweeps: tests/mininet/test_results_dir_mininet.py."""
from __future__ import annotations

import errno
import os

import pandas as pd
import pytest

from emu.config.footprint import ROW, RUNS_BASE, run_bytes
from emu.config.plan import load_plan
from emu.run.results import ResultsError, in_results, make_dir, record_run, storage_errno, write_parquet, write_text
from emu.sweeps import dryrun, space
from tasks import _iteration_bound, _sections, _workload_facts
from tests.conftest import REPO
from tests.factories import GOOD, dump, experiment, write


def _tmp_files(d):
    return [p for p in d.rglob("*") if ".tmp" in p.name]


def test_a_write_into_a_missing_directory_names_it_and_leaves_nothing(tmp_path):
    df = pd.DataFrame({"a": [1, 2]})
    with pytest.raises(ResultsError) as e:
        write_parquet(df, tmp_path / "gone" / "links.parquet")
    assert str(e.value) == f"{tmp_path / 'gone' / 'links.parquet'}: No such file or directory (ENOENT)"
    with pytest.raises(ResultsError, match="config.yaml: No such file"):
        write_text(tmp_path / "gone" / "config.yaml", "x")


def test_a_failed_write_removes_its_temporary_file_and_keeps_the_old_one(tmp_path):
    path = tmp_path / "runs.parquet"
    write_parquet(pd.DataFrame({"a": [1]}), path)
    bad = pd.DataFrame({"a": [object()]})   # pyarrow cannot convert it, after the file is opened or before
    with pytest.raises(Exception) as e:
        write_parquet(bad, path)
    assert not isinstance(e.value, ResultsError)   # the harness's own error stays what it is
    assert not _tmp_files(tmp_path) and pd.read_parquet(path)["a"].tolist() == [1]


def test_storage_errors_are_told_from_the_harness_own():
    assert storage_errno(OSError(errno.ENOSPC, "No space left on device")) == errno.ENOSPC
    assert storage_errno(OSError("[Errno 28] Error writing bytes to file")) == errno.ENOSPC   # pyarrow's
    assert storage_errno(OSError("Read-only file system")) == errno.EROFS
    assert storage_errno(OSError(errno.ECONNREFUSED, "Connection refused")) is None
    assert storage_errno(ValueError("x")) is None


def test_only_errors_under_the_sweep_directory_are_the_directory_s_fault(tmp_path):
    sweep = tmp_path / "s"
    sweep.mkdir()
    inside = FileNotFoundError(errno.ENOENT, "No such file or directory", str(sweep / "r1" / "logs" / "w.err"))
    outside = FileNotFoundError(errno.ENOENT, "No such file or directory", "/usr/bin/iperf3")
    assert "w.err: No such file or directory" in str(in_results(inside, sweep))
    assert in_results(outside, sweep) is None
    sweep.rmdir()
    assert str(in_results(inside, sweep)).startswith(f"{sweep}: removed during the sweep")


def test_a_row_is_not_recorded_into_a_removed_sweep_directory(tmp_path):
    record_run(tmp_path / "s", {"run_id": "a", "status": "ok"})   # a sweep's first row makes it, as before
    (tmp_path / "s" / "runs.parquet").unlink()
    (tmp_path / "s" / ".lock").unlink()
    (tmp_path / "s").rmdir()
    with pytest.raises(ResultsError, match="No such file or directory"):
        record_run(tmp_path / "s", {"run_id": "b", "status": "ok"}, create=False)
    assert not (tmp_path / "s").exists()


def test_the_sweep_directory_is_made_and_written_once_or_refused(tmp_path):
    make_dir(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir() and not list((tmp_path / "a" / "b").iterdir())
    (tmp_path / "f").write_text("")
    with pytest.raises(ResultsError, match="f: not a directory"):
        make_dir(tmp_path / "f")
    with pytest.raises(ResultsError, match=r"Not a directory \(ENOTDIR\)"):
        make_dir(tmp_path / "f" / "s")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a directory without write permission")
def test_a_directory_without_write_permission_is_refused_at_the_start(tmp_path):
    (tmp_path / "ro").mkdir(mode=0o555)
    with pytest.raises(ResultsError, match=r"ro: Permission denied \(EACCES\)"):
        make_dir(tmp_path / "ro")


# ---------------------------------------------------------------------------- the size model

def test_the_model_grows_with_duration_monitor_rates_workers_and_tracing(tmp_path):
    def _exp(**top):
        return load_plan(write(tmp_path, experiment(**top)), _sections()).experiments[0]

    exp = _exp()
    base = run_bytes(exp, 30.0, None)
    assert run_bytes(exp, 60.0, None).total > base.total
    assert max(base.parts, key=base.parts.get) == "qdiscs"   # 100 Hz queue samples on every link direction
    assert run_bytes(exp, 30.0, None, netlink=False).parts["qdiscs"] == pytest.approx(base.parts["qdiscs"] / 10, 0.01)
    assert run_bytes(exp, 30.0, None, k=2).parts["links"] == pytest.approx(base.parts["links"] / 2, 0.01)
    traced = run_bytes(_exp(trace=True), 30.0, None)
    assert traced.total > base.total and "tx_frames" in traced.parts
    ring = run_bytes(_exp(trace=True, scheduler="ring", roles={"servers": [], "workers": ["w0", "w1"]}), 30.0, None)
    assert "tx_frames" not in ring.parts   # no parameter server: no data frames recorded
    more = run_bytes(_exp(workload={**GOOD["workload"], "iterations": 300}), 30.0, None)
    assert more.parts["iterations"] == 100 * base.parts["iterations"]


def test_the_model_is_near_measured_runs():
    # the demo measured on the reference machine (du of each run's directory; netlink monitor):
    # fifo 16.8 s of wall clock, 324 kB; bytescheduler 11.3 s, 287 kB; traced (trace: true)
    # fifo 16.8 s, 586 kB, bytescheduler 12.8 s, 770 kB (more frames and events than fifo)
    fifo, bs = load_plan(_demo(), _sections()).experiments
    traced = {e.scheduler: e.model_copy(update={"trace": True}) for e in (fifo, bs)}
    for exp, wall_s, measured in ((fifo, 16.8, 324e3), (bs, 11.3, 287e3), (traced["fifo"], 16.8, 586e3),
                                  (traced["bytescheduler"], 12.8, 770e3)):
        est = run_bytes(exp, wall_s, _workload_facts(exp)).total
        assert 0.7 * measured < est < 1.2 * measured, (exp.scheduler, exp.trace, est, measured)


def _demo():
    return REPO / "configs" / "demo.yaml"


def _sweep(tmp_path, seeds=(0, 1, 2)):
    return load_plan(write(tmp_path, {**GOOD, "name": "s", "grid": {"seed": list(seeds)}}), _sections())


def test_earlier_runs_of_the_same_point_decide_its_estimate_and_scale_the_others(tmp_path):
    plan = _sweep(tmp_path)
    ids = [e.run_id(0) for e in plan.experiments]
    sweep = tmp_path / "results" / "s"
    (sweep / ids[0]).mkdir(parents=True)
    (sweep / ids[0] / "links.parquet").write_bytes(b"x" * 200_000)
    pd.DataFrame([{"run_id": ids[0], "status": "ok", "wall_s": 20.0}]).to_parquet(sweep / "runs.parquet")
    pts = dryrun.points(plan, tmp_path / "results", lambda e: 1.0)
    need = space.estimate(plan, tmp_path / "results", pts, lambda e: None)
    model = run_bytes(plan.experiments[1], pts[1].run_s, None).total
    ratio = space.du(sweep / ids[0]) / run_bytes(plan.experiments[0], 20.0, None).total
    now = (sweep / "runs.parquet").stat().st_size   # runs.parquet: two rows more, and a copy while it is rewritten
    assert need.runs == 2 and need.bytes == pytest.approx(2 * model * ratio + 2 * ROW + now + 2 * ROW, rel=0.01)
    assert "the model scaled by this sweep's earlier runs" in need.basis
    # a repeat of a point with an earlier run: that run's size
    plan2 = load_plan(write(tmp_path, {**GOOD, "name": "s", "seed": 0, "repeats": 2}, "r.yaml"), _sections())
    assert plan2.experiments[0].run_id(0) == ids[0]
    need2 = space.estimate(plan2, tmp_path / "results", dryrun.points(plan2, tmp_path / "results", lambda e: 1.0),
                           lambda e: None)
    assert need2.runs == 1 and need2.per_run == space.du(sweep / ids[0]) and need2.basis == \
        "earlier runs of the same point"


def test_a_sweep_that_cannot_fit_is_refused_with_its_figures(tmp_path):
    plan = _sweep(tmp_path)
    need = space.estimate(plan, tmp_path / "results", dryrun.points(plan, tmp_path / "results", lambda e: None),
                          lambda e: None)
    assert need.at_timeout == 3 and need.device == tmp_path and need.free > 0
    tight = space.Need(**{**need.__dict__, "free": need.bytes - 1})
    assert need.fits and not tight.fits
    text = tight.refusal()
    assert text.startswith(f"{tmp_path / 'results' / 's'}: not enough free space for this sweep: 3 run(s) need about")
    assert "from the model; largest: qdiscs" in text and "3 of them at their timeout_s" in text and " free on " in text


def test_a_profiled_workload_is_estimated_at_its_duration(tmp_path):
    path = dump(tmp_path / "d.yaml", {**GOOD, "name": "d", "workload": {**GOOD["workload"], "preset": "small"}})
    plan = load_plan(path, _sections())
    pts = dryrun.points(plan, tmp_path / "results", _iteration_bound)
    need = space.estimate(plan, tmp_path / "results", pts, _workload_facts)
    assert need.runs == 1 and need.at_timeout == 0 and "from the model; largest: " in need.figures()
    assert need.bytes == int(need.per_run + 2 * (RUNS_BASE + ROW))
