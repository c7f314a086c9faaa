"""The data path benchmark's pure parts: /proc/<pid>/stat, the per-Gbit arithmetic, the windows
over samples, and the grouping of profiled symbols."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from bench import bench_datapath as bd

# A real line's shape, with a command name holding a space and a parenthesis.
STAT = ("4242 (python (x) y) S 1 4242 4242 0 -1 4194560 1234 0 0 0 "
        "250 75 0 0 20 0 3 0 12345 1000000 2000 18446744073709551615")


def test_parse_stat_counts_fields_from_the_last_parenthesis():
    assert bd.parse_stat(STAT) == (250, 75)


def test_parse_stat_of_this_process():
    from pathlib import Path

    user, system = bd.parse_stat(Path("/proc/self/stat").read_text())
    assert user >= 0 and system >= 0


def test_per_gbit():
    assert bd.per_gbit(2.0, 125e6) == pytest.approx(2.0)   # 125 MB = 1 Gbit
    assert bd.per_gbit(1.0, 250e6) == pytest.approx(0.5)
    assert math.isnan(bd.per_gbit(1.0, 0))


def test_cpu_between_interpolates_ticks():
    tick = bd.TICK
    samples = [(0.0, 0, 0), (1.0, tick, tick // 2), (2.0, 3 * tick, tick)]
    user, system = bd.cpu_between(samples, 0.5, 1.5)
    assert user == pytest.approx(0.5 + 1.0)
    assert system == pytest.approx(0.25 + 0.25)
    with pytest.raises(ValueError):
        bd.cpu_between(samples, -0.1, 1.0)
    with pytest.raises(ValueError):
        bd.cpu_between(samples, 0.5, 2.1)


def test_snap_and_link_bytes():
    links = pd.DataFrame({"link": ["w0->s1"] * 5 + ["s1->w0"] * 5,
                          "t": [0.1, 0.2, 0.3, 0.4, 0.5] * 2,
                          "tx_bytes_per_s": [100.0, 1000.0, 1000.0, 2000.0, 5.0] + [10.0] * 5})
    a, b = bd.snap(links.loc[links["link"] == "w0->s1", "t"].to_numpy(), 0.15, 0.45)
    assert (a, b) == (0.2, 0.4)
    # the rows after a up to b: 0.3 (1000 B/s for 0.1 s) and 0.4 (2000 B/s for 0.1 s)
    assert bd.link_bytes(links, "w0->s1", a, b) == pytest.approx(300.0)
    assert bd.link_bytes(links, "s1->w0", a, b) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        bd.snap(links["t"].to_numpy(), 0.41, 0.45)


def test_mean_cost_and_ratio_in_the_table():
    workers = bd.mean_cost("PS worker", "fifo", 2, 400, [(125e6, 0.2, 0.1), (125e6, 0.4, 0.1)])
    assert workers.nbytes == pytest.approx(125e6)
    assert workers.per_gbit == pytest.approx(0.4)
    sender = bd.Cost("iperf3 sender", "one TCP flow", 0, 400, 250e6, 0.1, 0.1)        # 0.1 s per Gbit
    receiver = bd.Cost("iperf3 receiver", "one TCP flow", 0, 400, 250e6, 0.05, 0.05)  # 0.05
    server = bd.Cost("server", "fifo", 2, 400, 250e6, 0.4, 0.1)                       # 0.25
    text = bd.table([workers, server, sender, receiver], sender, receiver)
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[-2].strip(" |") for line in text.splitlines()[2:]}
    assert rows == {"PS worker": "4.0", "server": "5.0", "iperf3 sender": "1.0", "iperf3 receiver": "1.0"}


def test_switches_per_mb_from_the_samples():
    samples = [(0.0, 0, 0, 100), (1.0, 0, 0, 300), (2.0, 0, 0, 700)]
    assert bd.switches_between(samples, 0.5, 1.5) == pytest.approx(100 + 200)
    assert math.isnan(bd.switches_between([(0.0, 0, 0), (1.0, 0, 0)], 0.0, 1.0))
    cost = bd.mean_cost("server", "fifo", 2, 400, [(2e6, 0.1, 0.1, 50.0)])
    assert cost.switches_per_mb == pytest.approx(25.0)
    row = bd.table([cost], None, None).splitlines()[2]
    assert row.split(" | ")[-1].strip(" |") == "25"


def test_parse_switches_of_a_thread_status():
    status = "Name:\tpython\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n"
    assert bd.parse_switches(status) == 15
    from pathlib import Path

    assert bd.parse_switches(Path("/proc/self/status").read_text()) >= 0


def test_iterations_for_keeps_the_measured_time():
    g = 5e6
    # 4 workers through one server at 400 Mb/s: 20 MB a way per iteration, ~0.42 s
    assert bd.iterations_for("ps", 4, g, 400, 8.0, 2) == 2 + math.ceil(8.0 / (4 * g * 8 / (400e6 * 0.95)))
    assert bd.iterations_for("collective", 4, g, 400, 0.01, 2) == 5   # at least 3 measured


@pytest.mark.parametrize(("dso", "kind", "sym", "want"), [
    ("[kernel.kallsyms]", "k", "tcp_sendmsg_locked", "system calls"),
    ("[kernel.kallsyms]", "k", "copy_user_enhanced_fast_string", "copies"),
    ("[kernel.kallsyms]", "k", "_copy_to_iter", "copies"),
    ("[kernel.kallsyms]", "k", "futex_wait", "threads"),
    ("[kernel.kallsyms]", "k", "__schedule", "threads"),
    ("libc.so.6", "", "__memmove_avx_unaligned_erms", "copies"),
    ("libc.so.6", ".", "_int_malloc", "other"),
    ("python3.11", ".", "_PyEval_EvalFrameDefault", "Python"),
    ("_multiarray_umath.cpython-311-x86_64-linux-gnu.so", ".", "FLOAT_add_AVX2", "aggregation"),
    ("_multiarray_umath.cpython-311-x86_64-linux-gnu.so", ".", "PyUFunc_GenericFunction", "Python"),
    ("_multiarray_umath.cpython-311-x86_64-linux-gnu.so", ".", "PyArray_MultiplyList", "Python"),
    ("_multiarray_umath.cpython-311-x86_64-linux-gnu.so", ".", "_aligned_contig_to_contig_size4", "copies"),
    ("[unknown]", ".", "0x00007f0000001234", "other"),
])
def test_group(dso, kind, sym, want):
    assert bd.group(dso, kind, sym) == want


def test_parse_perf_report_and_groups():
    text = """
    40.00%  python3.11         [.] _PyEval_EvalFrameDefault
    30.00%  [kernel.kallsyms]  [k] tcp_sendmsg_locked
    20.00%  libc.so.6          [.] __memmove_avx_unaligned_erms
    10.00%  [kernel.kallsyms]  [k] futex_wake
#
not a line
"""
    entries = bd.parse_perf_report(text)
    assert entries[0] == (40.0, "python3.11", ".", "_PyEval_EvalFrameDefault")
    assert len(entries) == 4
    shares = bd.grouped(entries)
    assert list(shares) == list(bd.GROUPS)
    assert shares["Python"] == pytest.approx(40) and shares["system calls"] == pytest.approx(30)
    assert shares["copies"] == pytest.approx(20) and shares["threads"] == pytest.approx(10)
    assert sum(shares.values()) == pytest.approx(100)
