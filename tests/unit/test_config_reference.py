"""The config reference (emu/config/reference.py): docs/config-reference.md as the models render it,
every field described, every number with its unit, and `./inv explain`."""
from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

import tasks
from emu.config import plan, reference
from emu.config.experiment import Experiment
from schedulers.registry import PLUGIN_SPECS, params_models
from tests.conftest import invoke
from workloads.config import WorkloadConfig


def _models() -> list[type[BaseModel]]:
    schedulers = {n: m for n, m in params_models().items() if n not in PLUGIN_SPECS}
    return reference.models_of(Experiment, WorkloadConfig, schedulers)


def test_the_generated_file_is_up_to_date():
    on_disk = tasks.CONFIG_REFERENCE.read_text() if tasks.CONFIG_REFERENCE.exists() else ""
    assert on_disk == tasks._config_reference_markdown(), (
        "docs/config-reference.md is out of date with the config models: run ./inv explain --write")


def test_every_field_of_every_model_has_a_description():
    models = _models()
    assert len(models) > 20  # the walk reached the nested models (topology kinds, schedules, params)
    missing = reference.missing_descriptions(models)
    assert not missing, "fields without a description: " + ", ".join(missing)


def test_a_field_without_a_description_is_named():
    class Section(BaseModel):
        described: int = Field(default=1, description="a count")
        bare: int = 2

    class Top(BaseModel):
        inner: Section = Field(default=Section(), description="a section")

    assert reference.missing_descriptions(reference.models_of(Top)) == [
        f"{__name__}.test_a_field_without_a_description_is_named.<locals>.Section.bare"]


def test_every_number_has_a_unit_and_its_description_says_it():
    keys = [k for k in tasks._config_reference().keys() if k.numeric]
    assert len(keys) > 50
    missing = [k.path for k in keys if not k.unit]
    assert not missing, "numeric keys whose name or description gives no unit: " + ", ".join(missing)
    unsaid = [k.path for k in keys if not reference.described_unit(k.meaning)]
    assert not unsaid, ("numeric keys whose description names no unit (a word of reference.UNIT_WORDS: "
                        "seconds, ms, Mb/s, bytes, elements, fraction, count, ...): " + ", ".join(unsaid))


def test_keys_variants_and_sweep_keys():
    ref = tasks._config_reference()
    paths = {k.path for k in ref.keys()}
    for p in ("topology.heterogeneity.pick", "fidelity.window_s", "schedulers.forest.replan_threshold",
              "shaping[].schedule.window_ms", "faults[].kind", "workload.batch_size", "topology.wan_mbps"):
        assert p in paths
    kinds = {k.when for k in ref.keys() if k.path == "topology.kind"}
    assert kinds == {f"topology.kind: {t}" for t in ("star", "racks", "graph", "sites")}
    sweep = {k.path for k in ref.keys() if k.when == reference.SWEEP}
    assert sweep == {"name", *plan._PLAN_KEYS}
    [window] = reference.find(ref, "fidelity.window_s")
    assert (window.default, window.unit, window.range) == ("1.0", "s", "[0.1, 604800]")
    [pick] = reference.find(ref, "topology.hosts.0.name")
    assert pick.path == "topology.hosts[].name"
    assert {k.path for k in reference.find(ref, "watchdog")} == {"watchdog", "watchdog.stall_s",
                                                                 "watchdog.startup_s"}


def test_an_unknown_key_names_close_ones():
    with pytest.raises(reference.UnknownKey) as e:
        reference.find(tasks._config_reference(), "fidelity.windw_s")
    assert "fidelity.window_s" in e.value.close
    assert str(e.value).startswith("unknown config key 'fidelity.windw_s' (did you mean: fidelity.window_s")


@pytest.mark.slow
def test_explain_prints_a_keys_default_and_meaning():
    meaning = Experiment.model_fields["fidelity"].annotation.model_fields["window_s"].description
    r = invoke("explain", "fidelity.window_s", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "default: 1.0" in r.stdout
    assert " ".join(meaning.split()) in " ".join(r.stdout.split())
    r = invoke("explain", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "fidelity" in r.stdout and "repeats" in r.stdout


@pytest.mark.slow
def test_explain_of_an_unknown_key_exits_2_with_one_error_line():
    r = invoke("explain", "fidelity.windw_s", timeout=60)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown config key 'fidelity.windw_s'")
    assert "fidelity.window_s" in lines[0]
