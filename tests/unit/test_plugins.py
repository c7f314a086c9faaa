"""Plugins: schedulers from outside the repository (schedulers/registry/plugins.py).

A config's `plugins:` (files or modules) and installed packages' `schedlab.schedulers` entry
points register their schedulers; config validation sees them; each plugin's code is part of
the run id (configs without plugins keep theirs) and of meta.json, and its file is copied into
the run; the roles load it from the role spec. A plugin that cannot be used is one `error:` line
naming it (file and line for one that does not import), exit 2, nothing created. A plugin may
declare no bound model: analysis leaves its bound empty and says so, and a clash of its display
order with a built-in's still gives it a colour of its own.
"""
from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

import tasks
from analysis import bounds, catalog, physics, plots, report
from contracts.role_spec import RoleSpec
from contracts.scheduler_info import COLUMN, SchedulerInfo
from emu.config.experiment import ConfigError, Sections, validate_experiment
from emu.config.plan import load_plan
from schedulers import registry
from schedulers.registry import plugins
from tests.conftest import REPO
from tests.factories import no_network

DATA = REPO / "tests" / "data" / "plugins"
ALLTOALL = DATA / "alltoall.py"
CONFIG = {
    "name": "plug",
    "topology": {"kind": "star", "hosts": [{"name": "w0", "bw_mbps": 50}, {"name": "w1", "bw_mbps": 25}]},
    "roles": {"workers": ["w0", "w1"]},
    "workload": {"model": "cnn", "preset": "tiny", "iterations": 3},
    "scheduler": "alltoall",
}


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch):
    """Every test starts from the built-ins alone and leaves them so (plugins register globally)."""
    monkeypatch.setattr(registry, "SCHEDULERS", dict(registry.SCHEDULERS))
    monkeypatch.setattr(registry, "SOURCES", {})
    monkeypatch.setattr(registry, "PLUGIN_SPECS", {})
    monkeypatch.setattr(plugins, "_LOADED", {})
    monkeypatch.setattr(catalog, "_RECORDED", {})
    yield
    catalog.install({})


def _config(tmp_path: Path, plugin_specs, **changes) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "plugins": plugin_specs, **changes}))
    return path


# ---------------------------------------------------------------------------- loading
def test_a_plugin_file_registers_its_scheduler_once():
    first = plugins.load_plugins([str(ALLTOALL)], Path("/"))
    assert [i.names for i in first] == [("alltoall",)] and first[0].kind == "file"
    assert first[0].sha256 == hashlib.sha256(ALLTOALL.read_bytes()).hexdigest() and first[0].path == str(ALLTOALL)
    cls = registry.SCHEDULERS["alltoall"]
    again = plugins.load_plugins(["alltoall.py"], DATA)  # the same file, relative this time
    assert registry.SCHEDULERS["alltoall"] is cls and again[0].sha256 == first[0].sha256
    info = registry.infos()["alltoall"]
    assert info.plugin == "alltoall.py" and info.bound_model == "none" and info.display_name == "all-to-all"
    assert not (DATA / "__pycache__").exists()  # loading writes nothing beside the plugin


def test_a_module_plugin_has_the_hash_of_its_source_files(tmp_path, monkeypatch):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from mypkg.sched import *  # noqa\n")
    shutil.copy(ALLTOALL, pkg / "sched.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    (info,) = plugins.load_plugins(["mypkg"], tmp_path)
    assert info.kind == "module" and info.names == ("alltoall",) and info.module == "mypkg"
    assert len(info.sha256) == 64 and info.version is None
    sys.modules.pop("mypkg", None)
    sys.modules.pop("mypkg.sched", None)


def _error(tmp_path: Path, specs) -> str:
    with pytest.raises(ConfigError) as e:
        load_plan(_config(tmp_path, specs), tasks._sections())
    text = str(e.value)
    assert "\n" not in text
    return text


def test_each_broken_plugin_is_one_line_naming_it(tmp_path):
    bad = tmp_path / "broken_syntax.py"
    bad.write_text('"""A plugin with a syntax error on line 3."""\n\ndef oops(:\n    pass\n')
    assert _error(tmp_path, [str(bad)]).startswith(f"plugins[0]: {bad}: {bad}:3: SyntaxError")
    text = _error(tmp_path, [str(ALLTOALL), str(DATA / "broken_import.py")])
    assert text.startswith("plugins[1]: ") and "broken_import.py:6: RuntimeError: this plugin refuses" in text
    text = _error(tmp_path, [str(DATA / "clash.py")])
    assert "'ring'" in text and "MyRing" in text and "built-in" in text and "schedulers.collective.ring.Ring" in text
    assert "defines no Scheduler subclass" in _error(tmp_path, [str(DATA / "no_scheduler.py")])
    assert "no such file" in _error(tmp_path, ["missing.py"])
    assert "no such module" in _error(tmp_path, ["no_such_module_here"])
    assert _error(tmp_path, [3]).startswith("plugins[0]: must be a Python file or a module name")
    assert "alltoall" not in registry.SCHEDULERS  # nothing of a failing plan stays registered
    assert not list(tmp_path.glob("**/__pycache__"))


def test_two_plugins_with_one_name_clash(tmp_path):
    other = tmp_path / "other.py"
    shutil.copy(ALLTOALL, other)
    text = _error(tmp_path, [str(ALLTOALL), str(other)])
    assert text.startswith("plugins[1]: ") and "'alltoall'" in text and str(ALLTOALL) in text


@pytest.mark.slow  # a CLI or timing subprocess: about a second
def test_the_cli_prints_one_line_and_exits_2_creating_nothing(tmp_path):
    results = tmp_path / "results"
    r = subprocess.run([str(REPO / "inv"), "run", str(_config(tmp_path, [str(DATA / "clash.py")])), "--results",
                        str(results)], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: plugins[0]: ") and "clashes" in lines[0]
    assert not results.exists()


# ---------------------------------------------------------------------------- identity
def test_the_run_id_holds_the_plugins_code(tmp_path):
    plugin = tmp_path / "mine.py"
    shutil.copy(ALLTOALL, plugin)
    exp = load_plan(_config(tmp_path, ["mine.py"]), tasks._sections()).experiments[0]
    assert exp.scheduler_info.plugin == "mine.py"
    assert exp.resolved()["plugins"] == [{"spec": "mine.py", "kind": "file", "version": None,
                                          "sha256": hashlib.sha256(plugin.read_bytes()).hexdigest()}]
    plugin.write_text(plugin.read_text() + "\n# changed\n")
    changed = load_plan(_config(tmp_path, ["mine.py"]), tasks._sections()).experiments[0]
    assert changed.run_id(0) != exp.run_id(0)
    # without plugins (or with none) a config keeps its run id
    plain = {**CONFIG, "scheduler": "ring"}
    assert validate_experiment(plain, tasks._sections()).run_id(0) == \
        validate_experiment({**plain, "plugins": []}, tasks._sections()).run_id(0) == \
        validate_experiment(plain, Sections(workload=tasks._sections().workload,
                                            schedulers=tasks._sections().schedulers)).run_id(0)
    # a resolved config (config.yaml) validates again to the same run
    again = validate_experiment(changed.model_dump(mode="json"), tasks._sections(), tmp_path)
    assert again.run_id(0) == changed.run_id(0)
    with pytest.raises(ConfigError, match="plugins: this command cannot load plugins"):
        validate_experiment({**CONFIG, "plugins": ["mine.py"]}, Sections(), tmp_path)


def test_the_runner_copies_the_plugin_and_records_it(tmp_path, monkeypatch):
    """Up to the network (a stand-in that fails to come up): meta.json, the copy, the role specs."""
    from emu.run import runner

    no_network(monkeypatch, runner)
    exp = load_plan(_config(tmp_path, [str(ALLTOALL)]), tasks._sections()).experiments[0]
    row = runner.run_one(exp, 0, tmp_path / "results", state=None)
    run_dir = tmp_path / "results" / exp.name / exp.run_id(0)
    assert row["status"] == "failed"
    assert SchedulerInfo.model_validate_json(row[COLUMN]).plugin == str(ALLTOALL)
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["plugins"] == [{"spec": str(ALLTOALL), "kind": "file", "version": None,
                                "sha256": hashlib.sha256(ALLTOALL.read_bytes()).hexdigest()}]
    assert (run_dir / "plugins" / "alltoall.py").read_bytes() == ALLTOALL.read_bytes()
    specs = runner.role_specs(exp, {"w0": "10.0.0.1", "w1": "10.0.0.2"}, run_dir / "records")
    spec = RoleSpec.model_validate_json(specs[0][2].to_json())
    assert spec.plugins == [str(run_dir / "plugins" / "alltoall.py")]
    plain = runner.role_specs(validate_experiment({**CONFIG, "scheduler": "ring"}, tasks._sections()),
                              {"w0": "10.0.0.1", "w1": "10.0.0.2"}, run_dir / "records")
    assert "plugins" not in plain[0][2].to_json()  # role specs without plugins read as before


# ---------------------------------------------------------------------------- entry points
def test_an_installed_packages_entry_point_registers_its_scheduler(tmp_path, monkeypatch):
    pkg = tmp_path / "theirpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    shutil.copy(ALLTOALL, pkg / "sched.py")
    dist = tmp_path / "theirpkg-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: theirpkg\nVersion: 1.2.3\n")
    (dist / "entry_points.txt").write_text("[schedlab.schedulers]\nalltoall = theirpkg.sched:AllToAll\n")
    (dist / "top_level.txt").write_text("theirpkg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert any(ep.name == "alltoall" for ep in md.entry_points(group=plugins.GROUP))
    (info,) = plugins.load_entry_points()
    assert info.kind == "entry_point" and info.spec == "entry_point:alltoall" and info.version == "1.2.3"
    assert info.names == ("alltoall",) and info.module == "theirpkg.sched"
    # a config that uses it, without listing it, has it in its run id
    exp = validate_experiment(CONFIG, tasks._sections())
    assert [p.spec for p in exp.plugins] == ["entry_point:alltoall"] and exp.plugins[0].version == "1.2.3"
    assert exp.run_id(0) != validate_experiment({**CONFIG, "scheduler": "ring"}, tasks._sections()).run_id(0)
    for name in ("theirpkg", "theirpkg.sched"):
        sys.modules.pop(name, None)


# ---------------------------------------------------------------------------- analysis
def test_no_bound_leaves_the_bound_empty_and_says_so():
    assert bounds.bound_model("none", ["h1", "h2"], []) == "none"

    class Cap:
        varies, basis = False, "configured"

    run = pd.Series({"compute_median_s": 0.01, "iter_time_median_s": 0.05, "iter_time_mean_s": 0.05})
    values = bounds._no_bound(run, Cap, 0.02, 0.03)
    assert set(values) == set(bounds.COLUMNS)
    assert pd.isna(values["bound_s"]) and pd.isna(values["efficiency"]) and values["bound_model"] == "none"
    assert values["cut_efficiency"] == pytest.approx(0.4)
    assert physics.below_bound(pd.Series(values)) == ([], "below_bound: no bound")
    grp = pd.DataFrame([values])
    assert report._no_bound(grp) and "no bound" in report._model_text("none")


def test_a_plugin_whose_display_order_clashes_gets_a_colour_of_its_own():
    plugins.load_plugins([str(ALLTOALL)], Path("/"))
    catalog.install(registry.infos())
    slots = catalog.colour_slots()
    assert len(set(slots.values())) == len(slots)
    builtins = {n: i.display_order for n, i in registry.infos().items() if i.plugin is None}
    assert all(slots[n] == order for n, order in builtins.items())  # the built-ins keep theirs
    assert slots["alltoall"] == max(builtins.values()) + 1
    names = [i.display_name for i in catalog.infos().values()]  # all drawn together: a look each
    looks = {(plots._colour(n, names), plots._look(n, names)["marker"]) for n in names}
    assert len(looks) == len(slots)
    assert plots._colour("all-to-all", ["all-to-all", "fifo"]) != plots._colour("fifo", ["all-to-all", "fifo"])
    assert plots.scheduler_order(["all-to-all", "fifo"]) == ["fifo", "all-to-all"]


def test_a_plugins_scheduler_is_tuned_like_a_built_in(tmp_path):
    from emu.sweeps import tune

    plugin = tmp_path / "tuned.py"
    plugin.write_text(ALLTOALL.read_text().replace("    requires_servers = False\n", (
        "    requires_servers = False\n    chunk: int = 4\n")).replace('    display_name = "all-to-all"\n', (
        '    display_name = "all-to-all"\n    tuning = (TuneDim(name="chunk", param="chunk", low=1, high=64, '
        'integer=True, about="elements per chunk"),)\n')).replace(
        "from schedulers.api import CommError", "from schedulers.api import CommError, TuneDim"))
    spec = tune.prepare(_config(tmp_path, ["tuned.py"]), "alltoall", 2, tasks._sections())
    assert [d.name for d in spec.dims] == ["chunk"]
    trial = spec.experiment({"chunk": 16})
    assert trial.scheduler_params == {"chunk": 16} and [p.spec for p in trial.plugins] == ["tuned.py"]


def test_plugins_make_treatments_not_configurations():
    """A plugin scheduler's runs compare with the built-ins' on the same network, whichever sweep they are in."""
    from analysis import tables

    cfg = {"topology.kind": "star", "scheduler": "alltoall", "plugins": [{"spec": "mine.py", "sha256": "0" * 64}]}
    plain = {"topology.kind": "star", "scheduler": "ring"}
    assert tables._config_ident(None, [], cfg) == tables._config_ident(None, [], plain)


@pytest.mark.slow  # a CLI or timing subprocess: about a second
def test_a_ray_sweep_with_plugins_is_refused_in_one_line(tmp_path):
    """Plugin files are not shipped to a Ray cluster's nodes yet: refused before anything starts."""
    results = tmp_path / "results"
    r = subprocess.run([str(REPO / "inv"), "sweep", str(_config(tmp_path, [str(ALLTOALL)])), "--ray", "local",
                        "--results", str(results)], capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ("error: plugins: not supported with --ray yet (plugin files are not shipped to the "
                                "cluster's nodes); run this sweep without --ray"), r.stderr
    assert not results.exists()
