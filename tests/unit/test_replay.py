"""Replay mode and profiles: the exactness check, one-line config errors, committed profiles
that match the zoo. Exact aggregation with real buffers, the profile's timeline kept per layer
and bounded memory without torch, on loopback: tests/loopback/test_replay_loopback.py."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from emu.config.experiment import ConfigError, validate_experiment
from tasks import _sections
from tests import factories
from tests.conftest import REPO
from tests.factories import synthetic_profile
from workloads import profile_file
from workloads.config import MODELS, PROFILES
from workloads.data import make
from workloads.models import build, input_spec
from workloads.profile import Alone
from workloads.replay import TILE, Replay
from workloads.trainer import LayerwiseSGD

ODD = synthetic_profile([(0.0, [(7, 0.0), (1, 0.0)]), (0.0, [(4099, 0.0)]), (0.0, [(30_001, 0.0), (1000, 0.0)]),
                         (0.0, [(TILE * 2 + 5, 0.0)])])


def test_the_exactness_check_can_fail():
    rp = Replay(ODD, Alone(), rank=0, num_workers=1)
    rp.step()
    rp.finish()
    assert rp.max_abs_error == 0.0
    key = ODD.largest.key
    wrong = rp.grads[key].copy()
    wrong[:1000], wrong[1000:2000] = rp.grads[key][1000:2000], rp.grads[key][:1000]  # two chunks swapped
    assert rp._error(key, 0, wrong) > 0
    assert rp._error(key, 1, rp.grads[key]) > 0   # last iteration's content is not this one's


def test_replay_side_never_imports_torch():
    code = ("import sys, workloads.config, workloads.replay, workloads.worker, workloads.profile_file; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


# ----------------------------------------------------------------------------- config errors

def experiment(**workload):
    return factories.experiment(topology=factories.star_topology(ps=100, w0=10),
                                roles={"servers": ["ps"], "workers": ["w0"]}, workload=workload)


def error(**workload) -> str:
    with pytest.raises(ConfigError) as e:
        validate_experiment(experiment(**workload), _sections())
    return str(e.value)


def test_bad_workloads_are_one_line_errors_naming_the_field(tmp_path):
    names = [repr(m) for m in MODELS]
    models = ", ".join(names[:-1]) + " or " + names[-1]
    assert error(model="gpt9") == f"workload.model: must be one of {models}, got 'gpt9'"
    assert error(preset="huge") == "workload.preset: must be one of 'tiny', 'small' or 'paper', got 'huge'"
    assert error(model="cnn", preset="paper") == \
        "workload.preset: model 'cnn' has no preset 'paper' (it has tiny, small)"
    assert error(batch_size=0) == "workload.batch_size: must be > 0"
    assert error(speedup=0) == "workload.speedup: must be > 0"
    assert error(speedup=4) == "workload.speedup: only applies to compute: replay"
    assert error(model="bert", data="digits") == \
        "workload.data: digits is an image data set and model 'bert' takes token sequences"
    missing = tmp_path / "nope.json"
    assert error(compute="replay", profile=str(missing)) == f"workload.profile: {missing} not found"
    assert error(compute="replay", model="resnet", preset="small", profile="profiles/cnn-small.json") == \
        "workload.profile: profiles/cnn-small.json profiles model 'cnn' preset 'small', not 'resnet' 'small'"
    assert error(compute="replay", model="cnn", preset="small", batch_size=8).startswith(
        "workload.profile: profiles/cnn-small.json was measured at batch_size 32, not 8 (re-profile: ")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": 1, "model": "cnn"}))
    assert error(compute="replay", profile=str(bad)).startswith(f"workload.profile: {bad} is not a valid profile (")
    for e in (error(model="gpt9"), error(compute="replay", profile=str(missing))):
        assert "\n" not in e


def test_default_profile_hint(tmp_path, monkeypatch):
    import workloads.config as wc

    monkeypatch.setattr(wc, "PROFILES", tmp_path)
    assert error(compute="replay", model="vgg", preset="small") == (
        f"workload.profile: {tmp_path}/vgg-small.json not found; make it with: "
        f"./inv profile --model vgg --preset small")


def test_good_replay_workload_validates():
    exp = validate_experiment(experiment(compute="replay", model="vgg", preset="paper", speedup=20), _sections())
    assert exp.workload["compute"] == "replay" and exp.workload["speedup"] == 20


def _fifo(path):
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("make,message", [
    (lambda p: p.write_text('{"forward_lead_s": Infinity}'),
     "cannot be read: Infinity is not a number a profile can hold"),
    (lambda p: p.write_text('{"forward_lead_s": NaN}'), "cannot be read: NaN is not a number a profile can hold"),
    (lambda p: profile_file.save(ODD, p) or p.write_text(p.read_text().replace('"forward_lead_s": 0.0',
                                                                               '"forward_lead_s": 1e999')),
     "is not a valid profile (forward_lead_s: Input should be a finite number)"),
    (lambda p: p.write_text("[" * 100_000 + "]" * 100_000), "cannot be read: JSON nested too deeply"),
    (lambda p: p.write_text("[" + "0," * (3 << 20) + "0]"), "has 6291459 bytes; a profile has at most 4194304"),
    (lambda p: p.write_bytes(bytes(range(128, 256))), "is not UTF-8 text (byte 0x80 at offset 0; a binary file?)"),
    (_fifo, "is not a regular file"),
    (lambda p: p.mkdir(), "is not a regular file"),
], ids=["Infinity", "NaN", "1e999", "deep", "huge", "binary", "FIFO", "directory"])
def test_the_one_profile_loader_is_bounded_and_finite(tmp_path, make, message):
    """profile_file.load is what the config check and the replay worker both read through, so
    the worker meets the same limits: nothing but a regular file within MAX_PROFILE_BYTES,
    finite numbers only."""
    path = tmp_path / "p.json"
    make(path)
    with pytest.raises(profile_file.ProfileError) as e:
        profile_file.load(path)
    assert str(e.value) == f"{path} {message}"
    assert error(compute="replay", profile=str(path)) == f"workload.profile: {path} {message}"


# ----------------------------------------------------------------------------- committed profiles

COMMITTED = [(m, p) for m, (_, presets) in MODELS.items() for p in presets if p != "tiny"]


@pytest.mark.parametrize("model,preset", COMMITTED)
def test_committed_profile_matches_the_zoo(model, preset):
    prof = profile_file.check(PROFILES / f"{model}-{preset}.json", model, preset, 32)
    with torch.device("meta"):
        net = build(model, preset, seed=0)
    params = dict(net.named_parameters())
    assert {t.name: (t.numel, tuple(t.shape)) for t in prof.tensors} == \
        {n: (p.numel(), tuple(p.shape)) for n, p in params.items()}
    assert prof.grad_bytes == 4 * sum(p.numel() for p in params.values())
    assert prof.device.threads == 1 and prof.device.kind == "cpu"
    assert prof.iteration_s > 0 and all(layer.forward_s > 0 for layer in prof.layers)
    # medians per layer add up to at most the median step (noise hits some layer in most steps)
    assert 0.5 * prof.iteration_s < prof.forward_s + prof.backward_s < 1.05 * prof.iteration_s
    if preset == "small":  # layers and priorities as a real run discovers them
        tr = LayerwiseSGD(build(model, preset, seed=0), Alone(), lr=0.01, momentum=0.9, weight_decay=0)
        tr.step(make("synthetic", input_spec(model, preset), 0, 0, 2).batch())
        assert [layer.name for layer in prof.layers] == tr.layer_names
        assert [(t.key, t.name, t.layer) for t in prof.by_key] == [(t.key, t.name, t.priority) for t in tr.tensors]


@pytest.mark.slow
def test_profiler_cli_writes_a_replayable_profile(tmp_path):
    out = tmp_path / "p.json"
    r = subprocess.run([sys.executable, "-m", "workloads.profile", "lstm", "tiny", "--iterations", "2",
                        "--batch-size", "4", "--out", str(out)], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    prof = profile_file.check(out, "lstm", "tiny", 4)
    assert [layer.name for layer in prof.layers] == ["(model)", "embedding", "lstm"]
    assert prof.tensors[0].name == "decoder_bias"  # the output side's gradient is ready first
    bad = subprocess.run([sys.executable, "-m", "workloads.profile", "cnn", "paper"], cwd=REPO,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "model 'cnn' has no preset 'paper'" in bad.stderr
    shutil.rmtree(tmp_path)
