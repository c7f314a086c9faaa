"""The netlink monitor backend (emu/testbed/netlink.py) as root: the whole path against a pair of
network namespaces the test creates and removes (the parsers and the replayed monitor are in
tests/unit/test_netlink.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from emu.testbed import netlink, tc
from emu.testbed.monitor import Monitor


def ip(*args: str, ns: str | None = None) -> str:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def netns_pair():
    """Two namespaces joined by a veth pair, 10.77.0.1/2, htb on the first end (emu/testbed/tc.py's
    setup at its minimum, 8 bit/s), and 20 UDP datagrams (1442-byte frames) sent into it: the first
    15 KB pass in htb's burst, the rest stay queued. Yields (ns_a, ns_b, dev_a); removed after."""
    tag = f"sl{os.getpid() % 100000}"
    a, b, dev = f"{tag}a", f"{tag}b", f"{tag}x"
    made = []
    try:
        for ns in (a, b):
            ip("ip", "netns", "add", ns)
            made.append(ns)
        ip("ip", "link", "add", dev, "netns", a, "type", "veth", "peer", "name", f"{tag}y", "netns", b)
        for ns, d, addr in ((a, dev, "10.77.0.1/24"), (b, f"{tag}y", "10.77.0.2/24")):
            ip("ip", "addr", "add", addr, "dev", d, ns=ns)
            ip("ip", "link", "set", d, "up", ns=ns)
        for cmd in tc.setup_commands(dev, 0, queue_ms=20):
            ip(*cmd, ns=a)
        # 20 datagrams of 1400 bytes (1442-byte frames) from inside a (a fresh machine has no ping)
        code = ("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                "for _ in range(20): s.sendto(bytes(1400), ('10.77.0.2', 9))")
        subprocess.run(["ip", "netns", "exec", a, sys.executable, "-c", code], check=True, capture_output=True,
                       timeout=30)
        yield a, b, dev
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_netlink_reads_and_changes_what_tc_reads_and_changes(netns_pair, monkeypatch):
    a, b, dev = netns_pair
    path = f"/run/netns/{a}"
    def by_tc() -> tuple[int, int]:
        root = next(q for q in json.loads(ip("tc", "-s", "-j", "qdisc", "show", "dev", dev, ns=a)) if q.get("root"))
        return root["backlog"], root["drops"]

    for dump_from in (netlink.DUMP_FROM, 1):  # one get, then the dump a switch's namespace gets
        monkeypatch.setattr(netlink, "DUMP_FROM", dump_from)
        for _ in range(20):  # a packet the kernel sends on its own (IPv6 neighbour discovery) may join the queue
            before, rows = by_tc(), []
            s = netlink.Sampler({"a->b": (dev, path)}, {})
            s.qdiscs(rows, t0=0.0)
            s.close()
            if by_tc() == before:  # the queue held still while netlink read it
                break
        assert before[0] > 0 and [(r[3], r[4]) for r in rows] == [before]
    # Link counters: one dump, as ip reads them.
    (sock, index), = netlink.open_sockets({path: [dev]}).values()
    s = netlink.Sampler({}, {}, sockets={}, dump_socket=sock)
    s._counters = {index[dev]: [("tx", True)]}
    got = s.counters()["tx"]
    s.close()
    stats = json.loads(ip("ip", "-s", "-j", "link", "show", "dev", dev, ns=a))[0]["stats64"]
    assert got == stats["tx"]["bytes"]
    # Rate changes: the kernel holds what tc's own change gives it, up to 64-bit rates.
    rates = netlink.HtbRates()
    try:
        for bps in (10e6, 1e9, 50e9, 0):
            subprocess.run(["ip", "netns", "exec", a, *tc.change_command(dev, bps)], check=True)
            by_tc = ip("tc", "-d", "class", "show", "dev", dev, ns=a)
            rates.set(dev, path, 1e6)  # something else in between
            rates.set(dev, path, bps)
            by_netlink = ip("tc", "-d", "class", "show", "dev", dev, ns=a)
            assert by_netlink == by_tc, (bps, by_tc, by_netlink)
        with pytest.raises(netlink.NetlinkError, match="htb class change on lo"):
            rates.set("lo", path, 1e6)  # lo has no htb: the kernel's refusal is raised
    finally:
        rates.close()


def test_the_netlink_monitor_in_a_namespace_pair(netns_pair):
    a, _, dev = netns_pair
    mon = Monitor({}, {"a->b": (dev, f"/run/netns/{a}")}, {("a", "b"): 8000.0}, interval_s=0.05,
                  qdisc_interval_s=0.01, backend="netlink").start()
    time.sleep(0.5)
    _, qdiscs, cpu = mon.stop()
    assert 35 <= len(qdiscs) <= 51 and qdiscs["read_s"].max() < 0.005 and len(cpu) >= 4  # CPU: every 0.1 s
    assert (qdiscs["backlog_bytes"] > 0).all()
    assert all(sock.fileno() == -1 for sock, _ in mon._sampler._socks.values())  # closed: the namespace can go
