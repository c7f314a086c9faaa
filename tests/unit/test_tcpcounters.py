"""TCP counters of the hosts' namespaces (emu/testbed/tcpcounters.py): the /proc formats, the
differences per host and their totals, and the drops at a host's port from the queue table."""
from __future__ import annotations

import math
import os

import pandas as pd
import pytest

from emu.config.dilation import table_to_emulated
from emu.testbed import tcpcounters as tcpc
from tests.conftest import REPO

PROC_NET = REPO / "tests" / "data" / "proc_net"   # a Linux 6.18 machine's /proc/self/net/{snmp,netstat}


def _field(text: str, section: str, name: str) -> int:
    """One value read the plain way: the section's name line and its value line, by position."""
    lines = [ln.split()[1:] for ln in text.splitlines() if ln.startswith(f"{section}:")]
    return int(lines[1][lines[0].index(name)])


def test_parse_reads_every_section_of_real_files():
    snmp, netstat = (PROC_NET / "snmp").read_text(), (PROC_NET / "netstat").read_text()
    s = tcpc.parse(snmp)
    assert {"Ip", "Icmp", "Tcp", "Udp"} <= set(s)
    assert s["Tcp"]["MaxConn"] == -1 and s["Tcp"]["RtoMin"] == 200
    assert s["Tcp"]["RetransSegs"] == _field(snmp, "Tcp", "RetransSegs")
    n = tcpc.parse(netstat)
    assert {"TcpExt", "IpExt"} <= set(n)
    assert n["TcpExt"]["TCPTimeouts"] == _field(netstat, "TcpExt", "TCPTimeouts")
    assert len(n["TcpExt"]) == len(netstat.splitlines()[0].split()) - 1


def test_counters_name_each_column_from_its_file():
    snmp, netstat = (PROC_NET / "snmp").read_text(), (PROC_NET / "netstat").read_text()
    got = tcpc.counters(snmp, netstat)
    assert list(got) == list(tcpc.COUNTERS)
    for col, (f, section, name) in tcpc.COUNTERS.items():
        assert got[col] == _field(snmp if f == "snmp" else netstat, section, name), col
    # a kernel without a field: None, not an error
    assert tcpc.counters(snmp, "TcpExt: SyncookiesSent\nTcpExt: 0\n")["timeouts"] is None


def test_parse_leaves_out_what_is_not_numbers():
    assert tcpc.parse("Tcp: A B\nTcp: x 1\nUdp: C\nUdp: 7\nno colon here\n") == {"Udp": {"C": 7}}


def test_read_this_process_namespace():
    got = tcpc.read(os.getpid())
    assert got is not None and got["out_segs"] >= 0 and got["retrans_segs"] >= 0
    assert tcpc.read(2 ** 22 + 1) is None   # above pid_max: no such process


def _proc(root, pid: int, retrans: int, timeouts: int) -> None:
    """A /proc/<pid>/net with the real files' layout and the two counters changed."""
    snmp, netstat = (PROC_NET / "snmp").read_text(), (PROC_NET / "netstat").read_text()

    def put(text: str, section: str, name: str, value: int) -> str:
        lines = text.splitlines()
        i = next(j for j, ln in enumerate(lines) if ln.startswith(f"{section}:"))
        values = lines[i + 1].split()
        values[lines[i].split().index(name)] = str(value)
        lines[i + 1] = " ".join(values)
        return "\n".join(lines) + "\n"

    d = root / str(pid) / "net"
    d.mkdir(parents=True, exist_ok=True)
    (d / "snmp").write_text(put(snmp, "Tcp", "RetransSegs", retrans))
    (d / "netstat").write_text(put(netstat, "TcpExt", "TCPTimeouts", timeouts))


def test_host_counters_keep_the_differences_per_host(tmp_path):
    _proc(tmp_path, 11, retrans=100, timeouts=5)
    _proc(tmp_path, 12, retrans=0, timeouts=0)
    _proc(tmp_path, 13, retrans=7, timeouts=1)
    hc = tcpc.HostCounters({"ps": 11, "w0": 12, "gone": 13, "never": 14}, proc=tmp_path)
    _proc(tmp_path, 11, retrans=160, timeouts=7)
    _proc(tmp_path, 12, retrans=3, timeouts=0)
    (tmp_path / "13" / "net" / "snmp").unlink()   # the host's shell exited before the end
    t = hc.table().set_index("host")
    assert list(t.columns) == tcpc.COLUMNS[1:]
    assert t.loc["ps", "retrans_segs"] == 60 and t.loc["ps", "timeouts"] == 2 and t.loc["ps", "out_segs"] == 0
    assert t.loc["w0", "retrans_segs"] == 3
    assert t.loc[["gone", "never"]].isna().all().all()
    tot = tcpc.totals(t.reset_index())
    assert tot["tcp_retrans_segs"] == 63 and tot["tcp_timeouts"] == 2 and set(tot) == {f"tcp_{c}" for c in
                                                                                       tcpc.COUNTERS}
    assert all(math.isnan(v) for v in tcpc.totals(None).values())
    # counts: the same in both clocks
    pd.testing.assert_frame_equal(table_to_emulated("tcp", t, 4.0), t)


def test_drops_toward_a_host_are_each_directions_rise():
    q = pd.DataFrame({"link": ["s1->ps", "s1->ps", "s1->ps", "ps->s1", "s1->w0", "s1->w0", "s1->px"],
                      "t": [0.3, 0.1, 0.2, 0.3, 0.1, 0.2, 0.2],
                      "read_s": 0.001, "backlog_bytes": 0, "drops": [40, 2, 10, 99, 5, 6, 50]})
    assert tcpc.drops_toward(q, ["ps"]) == 38           # last (t 0.3) less first (t 0.1); not ps->s1
    assert tcpc.drops_toward(q, ["ps", "w0"]) == 39
    assert tcpc.drops_toward(q, ["px"]) == 0            # one sample: nothing seen to rise
    assert tcpc.drops_toward(q) == 39                   # every direction: ps->s1 has one sample too
    for nothing in ((q, []), (q, ["w9"]), (q.iloc[:0], ["ps"]), (None, ["ps"])):
        assert math.isnan(tcpc.drops_toward(*nothing))


@pytest.mark.parametrize("name", ["snmp", "netstat"])
def test_the_fixture_files_are_real_proc_text(name):
    lines = (PROC_NET / name).read_text().splitlines()
    assert len(lines) % 2 == 0 and all(a.split(":")[0] == b.split(":")[0] for a, b in zip(lines[::2], lines[1::2],
                                                                                           strict=True))
