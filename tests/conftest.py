"""Shared test helpers: repository paths, the root check, the test tiers, and leftover detection."""
from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="end-to-end Mininet tests need root (run: sudo ./inv test)")

# Tiers (markers declared in pyproject.toml). `./inv test --fast` deselects `mininet`, `root`
# and `slow`; `./inv test` runs everything. A test that builds a Mininet network is marked
# `mininet` in its file and is given `root` here. `slow`: the tests below, each about a second
# or more on the reference machine (measured with --durations); with them out the fast tier
# takes well under a minute there. An entry is a test's node id; without a parameter part
# it covers every parametrization, with one (`[gloo-*]`) the matching ones (fnmatch).
# tests/test_lint.py checks that every entry still names a test.
SLOW = [
    "tests/unit/test_tune.py::test_an_interrupted_trial_runs_again_first_on_resume",
    "tests/unit/test_models.py::test_paper_preset_has_the_published_size[lstm]",
    "tests/unit/test_analysis.py::test_each_figure_draws_the_mini_sweep[link_utilisation_plot]",
    "tests/unit/test_physics.py::test_the_report_lists_a_run_that_breaks_physics_instead_of_averaging_it",
    "tests/loopback/test_schedulers_loopback.py::test_average_equals_reference[bytescheduler-2w-1s]",
    "tests/loopback/test_schedulers_ps_family.py::test_many_slices_over_servers_average_exactly[mercury-params1]",
    "tests/unit/test_faults_analysis.py::test_figure_and_report_section",
    "tests/unit/test_startup_analysis.py::test_startup_figure_and_report_section",
    "tests/unit/test_tune.py::test_cli_refuses_bad_input_with_one_line_exit_2_nothing_created",
    "tests/unit/test_placement.py::test_cli_bad_best_one_line_exit_2_nothing_created",
    "tests/unit/test_analysis.py::test_notebook_rebuilds_the_figure",
    "tests/unit/test_analysis.py::test_report_of_a_faceted_sweep_with_repeats_tests_a_claim",
    "tests/unit/test_analysis.py::test_report_task_refuses_a_missing_sweep",
    "tests/unit/test_analysis.py::test_report_task_writes_every_figure_and_the_measured_numbers",
    "tests/unit/test_analysis.py::test_report_without_a_trace_says_why_the_timeline_is_missing",
    "tests/loopback/test_faults_loopback.py::test_a_stop_longer_than_the_window_fails_the_run_naming_the_fault",
    "tests/loopback/test_faults_loopback.py::test_an_injected_kill_is_named_in_the_exit_reason",
    "tests/unit/test_faults.py::test_stop_and_kill_act_on_a_real_process_group",
    "tests/unit/test_faults_analysis.py::test_a_sweep_without_faults_has_no_faults_section",
    "tests/loopback/test_forest.py::test_different_plans_refuse_to_connect",
    "tests/loopback/test_forest.py::test_heterogeneous_star_average[8]",
    "tests/loopback/test_forest.py::test_killed_worker_named_by_every_worker_within_bounded_time",
    "tests/loopback/test_forest.py::test_trace_records_sends_and_results",
    "tests/loopback/test_forest.py::test_two_racks_deep_trees_and_huge_tensor",
    "tests/loopback/test_forest.py::test_worker_that_never_starts_is_named",
    "tests/loopback/test_forest_replan.py::test_workers_that_know_different_networks_refuse_to_connect",
    "tests/loopback/test_hierarchical.py::test_default_params_and_a_tensor_larger_than_a_bucket",
    "tests/loopback/test_hierarchical.py::test_missing_worker_fails_rendezvous_in_time",
    "tests/loopback/test_hierarchical.py::test_stages_overlap_on_emulated_links",
    "tests/unit/test_models.py::test_forward_matches_the_data[resnet]",
    "tests/unit/test_models.py::test_forward_matches_the_data[vgg]",
    "tests/unit/test_models.py::test_paper_preset_has_the_published_size[bert]",
    "tests/unit/test_raysweep.py::test_cli_unreachable_address_exit_2_nothing_created",
    "tests/mininet/test_raysweep_mininet.py::test_sigterm_cancels_the_runs_and_leaves_no_ray_process",
    "tests/mininet/test_raysweep_mininet.py::test_two_node_cluster_runs_each_once_and_retries_a_lost_nodes_run",
    "tests/unit/test_replay.py::test_profiler_cli_writes_a_replayable_profile",
    "tests/loopback/test_replay_loopback.py::test_replay_aggregates_exactly_in_order[bytescheduler-params1]",
    "tests/loopback/test_replay_loopback.py::test_replay_keeps_the_profiles_per_layer_times",
    "tests/loopback/test_replay_loopback.py::test_replay_worker_holds_about_twice_its_gradients_and_no_torch",
    "tests/mininet/test_repo_vagrant.py::test_vagrantfile_syntax",  # installs vagrant where it is missing (about 10 s)
    "tests/loopback/test_schedulers_collective.py::test_gloo_missing_worker_fails_rendezvous_in_time",
    "tests/loopback/test_schedulers_collective.py::test_gloo_worker_death_ends_everyone",
    "tests/loopback/test_schedulers_collective.py::test_ring_keeps_emulated_links_busy",
    "tests/loopback/test_schedulers_collective.py::test_ring_missing_worker_fails_rendezvous_in_time",
    "tests/loopback/test_schedulers_collective.py::test_training_end_to_end_matches_parameter_server",
    "tests/loopback/test_schedulers_loopback.py::test_average_equals_reference[bytescheduler-3w-2s]",
    "tests/loopback/test_schedulers_loopback.py::test_average_equals_reference[bytescheduler-8w-4s]",
    "tests/loopback/test_schedulers_loopback.py::test_average_equals_reference[forest-2w]",
    "tests/loopback/test_schedulers_loopback.py::test_average_equals_reference[forest-3w]",
    "tests/loopback/test_schedulers_loopback.py::test_average_equals_reference[forest-8w]",
    "tests/loopback/test_schedulers_loopback.py::test_average_equals_reference[gloo-*]",
    "tests/loopback/test_schedulers_loopback.py::test_paper_defaults_huge_tensor",
    "tests/loopback/test_schedulers_ps_family.py::test_dead_worker_makes_servers_and_workers_fail_naming_it",
    "tests/unit/test_startup_analysis.py::test_report_has_the_startup_section",
    "tests/unit/test_sweep.py::test_cli_bad_sweep_exit_2_nothing_run",
    "tests/loopback/test_trainer.py::test_cnn_distributed_equals_union_batch[forest-*]",
    "tests/loopback/test_trainer.py::test_zoo_distributed_equals_union_batch[lstm-forest]",
    "tests/loopback/test_trainer.py::test_zoo_distributed_equals_union_batch[resnet-bytescheduler]",
    "tests/loopback/test_trainer.py::test_zoo_distributed_equals_union_batch[vgg-bytescheduler]",
    "tests/unit/test_tune.py::test_a_failed_run_is_a_failed_trial_and_a_measured_proposal_is_reused",
    "tests/unit/test_tune.py::test_p3_slice_is_tuned_too",
    "tests/unit/test_tune.py::test_same_seed_same_trials_and_resuming_does_not_repeat_finished_trials",
    "tests/unit/test_tune.py::test_study_finds_the_optimum_of_a_synthetic_function_within_the_budget",
    "tests/unit/test_watchdog.py::test_a_stopped_role_stops_reporting_and_shows_as_stopped",
    "tests/loopback/test_watchdog_loopback.py::test_runner_survives_a_short_pause_and_names_a_stopped_worker_of_a_real_job",
]


def slow_entry_matches(entry: str, nodeid: str) -> bool:
    base, _, params = entry.partition("[")
    node_base, _, node_params = nodeid.partition("[")
    if base != node_base:
        return False
    return not params or fnmatch.fnmatchcase(node_params.removesuffix("]"), params.removesuffix("]"))


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("mininet"):
            item.add_marker(pytest.mark.root)
        if any(slow_entry_matches(e, item.nodeid) for e in SLOW):
            item.add_marker(pytest.mark.slow)


def invoke(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """Run one of tasks.py's tasks the way a user does (without the bootstrap wrapper)."""
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO, **kw)


def wait_for(pred, timeout: float, what: str):
    """pred()'s first truthy value within `timeout` seconds (polled every 0.1 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def worker_progress(results: Path, sweep: str, worker: str = "worker1") -> int:
    """The most iterations `worker` has reported in any run of `sweep` under `results`."""
    best = 0
    for p in results.glob(f"{sweep}/*/records/{worker}.progress"):
        try:
            best = max(best, int(p.read_text() or 0))
        except (OSError, ValueError):
            pass
    return best


def invoke_popen(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True)


def interfaces() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def namespaces_pids() -> set[int]:
    """Processes in a network namespace other than ours (Mininet hosts and their roles)."""
    mine = os.readlink("/proc/self/ns/net")
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.readlink(f"/proc/{d}/ns/net") != mine:
                    out.add(int(d))
            except OSError:
                pass
    return out


@pytest.fixture
def no_leftovers():
    """Fails the test if it leaves an interface, a namespaced process or a state record."""
    # v1: a group per host in the cpu (and cpuacct) hierarchy; v2: under the harness's own group
    from emu.testbed.cgroups import V2_PARENT
    root = Path("/sys/fs/cgroup")
    places = [root / "cpu", root / "cpuacct", root / V2_PARENT, root / "unified" / V2_PARENT]
    def cgroups() -> set[str]:
        own = {str(d) for d in places[2:] if d.is_dir()}   # the v2 parent itself goes with the network too
        return own | {str(p) for d in places if d.is_dir() for p in d.iterdir() if p.is_dir()}
    before_if, before_ns, before_cg = interfaces(), namespaces_pids(), cgroups()
    yield
    after_if = interfaces() - before_if
    after_ns = namespaces_pids() - before_ns
    assert not cgroups() - before_cg, f"cgroups left behind: {sorted(cgroups() - before_cg)}"
    state = Path("/run/schedlab")
    records = [p for p in state.glob("*/*.json") if "owner" not in p.name] if state.exists() else []
    assert not after_if, f"interfaces left behind: {sorted(after_if)}"
    assert not after_ns, f"processes left in network namespaces: {sorted(after_ns)}"
    assert not records, f"state records left behind: {records}"
