"""The netlink monitor backend (emu/testbed/netlink.py): its parsers against pyroute2's decoders,
on synthetic messages and on replies recorded from a kernel; the monitor's rows from replayed
replies, without a namespace; the htb change request as tc would send it; and, as root
(tests/mininet/test_netlink_netns.py), the whole path against a pair of network namespaces the
test creates and removes."""
from __future__ import annotations

import json
import struct
import time

import pytest

from emu.testbed import netlink, tc
from emu.testbed.monitor import Monitor
from tests.conftest import REPO

pyroute2 = pytest.importorskip("pyroute2", reason="pyroute2 (requirements.txt) is not installed")
from pyroute2.netlink.rtnl.ifstatsmsg import ifstatsmsg  # noqa: E402
from pyroute2.netlink.rtnl.tcmsg import tcmsg  # noqa: E402

DATA = REPO / "tests" / "data" / "netlink"


def nlmsg(mtype: int, body: bytes, flags: int = 0, seq: int = 0) -> bytes:
    return struct.pack("=IHHII", 16 + len(body), mtype, flags, seq, 0) + body


def nla(atype: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), atype) + payload
    return raw + b"\0" * (-len(raw) % 4)


def qdisc_reply(ifindex: int, backlog: int, drops: int, parent: int = netlink.TC_H_ROOT, nested_flag: bool = False,
                nbytes: int = 123_456_789_012, packets: int = 4321, seq: int = 0) -> bytes:
    """An RTM_NEWQDISC as the kernel words it for htb: kind, options, stats2 (a pad, basic,
    rate_est, queue), legacy stats."""
    stats2 = (nla(6, b"") + nla(1, struct.pack("=QIxxxx", nbytes, packets)) + nla(2, struct.pack("=II", 0, 0))
              + nla(3, struct.pack("=IIIII", 3, backlog, drops, 0, 7)))
    body = (struct.pack("=BxxxiIII", 0, ifindex, netlink.HTB_HANDLE, parent, 2)
            + nla(netlink.TCA_KIND, b"htb\0") + nla(netlink.TCA_OPTIONS, nla(2, struct.pack("=IIIII", 3, 10, 1, 0, 0)))
            + nla(7 | (0x8000 if nested_flag else 0), stats2)
            + nla(3, struct.pack("=QIIIIIII", nbytes, packets, drops, 7, 0, 0, 3, backlog)))
    return nlmsg(netlink.RTM_NEWQDISC, body, seq=seq)


def stats_reply(ifindex: int, rx: int, tx: int, flags: int = netlink.NLM_F_MULTI) -> bytes:
    link64 = struct.pack("=24Q", 11, 22, rx, tx, *range(20))
    return nlmsg(netlink.RTM_NEWSTATS, struct.pack("=BxxxiI", 0, ifindex, 1) + nla(0, b"") + nla(1, link64), flags)


def error_reply(code: int, seq: int = 0) -> bytes:
    return nlmsg(netlink.NLMSG_ERROR, struct.pack("=i", -code) + bytes(16), seq=seq)


def done() -> bytes:
    return nlmsg(netlink.NLMSG_DONE, struct.pack("=i", 0), netlink.NLM_F_MULTI)


def pyroute2_qdisc(data: bytes) -> tuple[int, int, int, int]:
    m = tcmsg(data)
    m.decode()
    q = m.get_attr("TCA_STATS2").get_attr("TCA_STATS_QUEUE")
    return m["index"], m["parent"], q["backlog"], q["drops"]


def first(data: bytes) -> netlink.Msg:
    return next(netlink.messages(data, len(data)))


@pytest.mark.parametrize("nested_flag", [False, True])
def test_qdisc_reply_parses_as_pyroute2_decodes_it(nested_flag):
    data = qdisc_reply(7, backlog=150_000, drops=12, nested_flag=nested_flag)
    m = first(data)
    assert (m.type, m.start, m.end) == (netlink.RTM_NEWQDISC, 16, len(data))
    q = netlink.parse_qdisc(data, m.start, m.end)
    assert (q.ifindex, q.parent, q.backlog, q.drops) == (7, netlink.TC_H_ROOT, 150_000, 12)
    assert (q.qlen, q.bytes, q.packets, q.handle) == (3, 123_456_789_012, 4321, 0x50000)
    if not nested_flag:  # the kernel sends TCA_STATS2 without the flag; the parser takes either
        assert pyroute2_qdisc(data) == (7, netlink.TC_H_ROOT, 150_000, 12)


def test_the_monitors_fast_read_agrees_with_the_full_parse_and_checks_its_shortcut():
    cache: dict[int, int] = {}
    for data in (qdisc_reply(3, 5_000, 2), qdisc_reply(4, 70_000, 9, nested_flag=True)):
        m = first(data)
        full = netlink.parse_qdisc(data, m.start, m.end)
        assert netlink.queue_stats(data, m.start, m.end, cache) == (full.ifindex, full.backlog, full.drops)
    assert len(cache) == 1  # one layout seen, remembered
    # Same length, another layout (queue before rate_est): the remembered place is checked, not trusted.
    rate_est, queue = nla(2, struct.pack("=II", 0, 0)), nla(3, struct.pack("=IIIII", 3, 8_888, 1, 0, 7))
    other = qdisc_reply(5, 8_888, 1).replace(rate_est + queue, queue + rate_est)
    m = first(other)
    assert len(other) == len(qdisc_reply(3, 5_000, 2))
    assert netlink.queue_stats(other, m.start, m.end, cache) == (5, 8_888, 1)
    no_stats = struct.pack("=BxxxiIII", 0, 6, 0, 0, 0)
    assert netlink.queue_stats(no_stats, 0, len(no_stats), {}) == (6, 0, 0)


def test_link_stats_parse_as_pyroute2_decodes_them():
    data = stats_reply(9, rx=2 ** 40 + 5, tx=77)
    m = first(data)
    got = netlink.parse_link_stats(data, m.start, m.end)
    p = ifstatsmsg(data)
    p.decode()
    s = p.get_attr("IFLA_STATS_LINK_64")
    assert got == (p["ifindex"], s["rx_bytes"], s["tx_bytes"]) == (9, 2 ** 40 + 5, 77)
    no_counters = nlmsg(netlink.RTM_NEWSTATS, struct.pack("=BxxxiI", 0, 3, 0))
    assert netlink.parse_link_stats(no_counters, 16, len(no_counters)) is None


def test_truncated_and_empty_buffers_yield_nothing():
    data = qdisc_reply(1, 1, 1) + stats_reply(2, 3, 4)
    assert [m.type for m in netlink.messages(data, len(data))] == [netlink.RTM_NEWQDISC, netlink.RTM_NEWSTATS]
    assert [m.type for m in netlink.messages(data, len(data) - 1)] == [netlink.RTM_NEWQDISC]
    assert list(netlink.messages(b"", 0)) == []
    q = netlink.parse_qdisc(struct.pack("=BxxxiIII", 0, 4, 0, 0, 0), 0, 20)  # no stats at all
    assert (q.ifindex, q.backlog, q.drops) == (4, 0, 0)


@pytest.mark.skipif(not (DATA / "recorded.json").exists(), reason="no recorded replies")
def test_recorded_kernel_replies_parse_as_pyroute2_decodes_them():
    """Replies recorded from Linux (tests/data/netlink/recorded.json says how), with what
    `tc -s -j` and `ip -s -j` printed at the same moment."""
    rec = json.loads((DATA / "recorded.json").read_text())
    for case in rec["qdiscs"]:
        data = bytes.fromhex(case["hex"])
        got = [netlink.parse_qdisc(data, m.start, m.end) for m in netlink.messages(data, len(data))
               if m.type == netlink.RTM_NEWQDISC]
        (q,) = got
        assert (q.ifindex, q.parent, q.backlog, q.drops) == pyroute2_qdisc(data[:first(data).end])
        assert (q.backlog, q.drops, q.qlen) == (case["tc"]["backlog"], case["tc"]["drops"], case["tc"]["qlen"])
    data = bytes.fromhex(rec["link_stats"]["hex"])
    got = {}
    for m in netlink.messages(data, len(data)):
        if m.type == netlink.RTM_NEWSTATS:
            ifindex, rx, tx = netlink.parse_link_stats(data, m.start, m.end)
            p = ifstatsmsg(data[m.start - 16:m.end])
            p.decode()
            assert (rx, tx) == (p.get_attr("IFLA_STATS_LINK_64")["rx_bytes"],
                                p.get_attr("IFLA_STATS_LINK_64")["tx_bytes"])
            got[ifindex] = (rx, tx)
    for ifindex, (rx, tx) in rec["link_stats"]["ip"].items():
        assert got[int(ifindex)] == (rx, tx)


class ReplaySocket:
    """Queues the scripted replies of each request when it is sent (as the kernel does)."""

    def __init__(self, script: list[list[bytes]]):
        self.script, self.queue, self.sent = list(script), [], []

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        self.queue += self.script.pop(0) if self.script else []
        return len(data)

    def recv_into(self, buf, nbytes=0, flags=0) -> int:
        if not self.queue:
            raise TimeoutError("no netlink reply")  # what emu.testbed.netlink._recv raises after its wait
        d = self.queue.pop(0)
        buf[:len(d)] = d
        return len(d)

    def close(self) -> None:
        pass


def test_the_sampler_turns_replies_into_the_tables_rows():
    """Host namespaces answer for their interface; the root namespace for two in one
    exchange (one of them gone: an error, the other still counts); counters come in a dump
    over two datagrams."""
    h1 = ReplaySocket([[qdisc_reply(2, 9_000, 1)], [qdisc_reply(2, 0, 1)]])
    root = ReplaySocket([[qdisc_reply(5, 64_000, 0), error_reply(19)]] * 2)
    dump = ReplaySocket([[stats_reply(5, 100, 1_000) + stats_reply(1, 7, 7), stats_reply(6, 200, 2_000) + done()]])
    egress = {"h1->s1": ("h1-eth0", 4242), "s1->h1": ("s1-eth1", None), "s1->h2": ("s1-eth2", None)}
    counters = {"s1->h1": ("s1-eth1", "tx"), "h1->s1": ("s1-eth1", "rx"), "h2->s1": ("s1-eth2", "rx")}
    sockets = {4242: (h1, {"h1-eth0": 2}), None: (root, {"s1-eth1": 5, "s1-eth2": 6})}
    s = netlink.Sampler(egress, counters, sockets=sockets, dump_socket=dump)
    clock = iter([10.0, 10.001, 10.003])  # each exchange starts where the one before ended
    rows: list = []
    s.qdiscs(rows, t0=9.0, now=lambda: next(clock))
    assert rows == [("h1->s1", pytest.approx(1.001), pytest.approx(0.001), 9_000, 1),
                    ("s1->h1", pytest.approx(1.003), pytest.approx(0.002), 64_000, 0)]
    assert h1.sent == [netlink.qdisc_request(2)] and root.sent == [netlink.qdisc_request(5) + netlink.qdisc_request(6)]
    assert s.counters() == {"s1->h1": 1_000, "h1->s1": 100, "h2->s1": 200}
    assert dump.sent == [netlink.link_stats_request()]
    # A namespace that does not answer is skipped, the others still sampled.
    h1.script = []
    rows.clear()
    s.qdiscs(rows, t0=0.0)
    assert [r[0] for r in rows] == ["s1->h1"]


def test_a_namespace_with_many_shaped_interfaces_is_read_by_one_dump():
    """The switch's namespace: one dump over two datagrams; only the root qdiscs of its
    shaped interfaces count (not a class's leaf qdisc, not the machine's other devices)."""
    ports = {f"s1-eth{i}": 10 + i for i in range(1, 5)}
    replies = [qdisc_reply(11, 1_500, 0) + qdisc_reply(11, 99, 9, parent=0x50001) + qdisc_reply(2, 77, 7),
               qdisc_reply(12, 0, 3) + qdisc_reply(13, 3_000, 0) + qdisc_reply(14, 0, 0) + done()]
    root = ReplaySocket([replies])
    egress = {f"s1->h{i}": (f"s1-eth{i}", None) for i in range(1, 5)}
    s = netlink.Sampler(egress, {}, sockets={None: (root, ports)})
    rows: list = []
    s.qdiscs(rows, t0=0.0)
    assert root.sent == [netlink.qdisc_dump_request()]
    assert [(r[0], r[3], r[4]) for r in rows] == [("s1->h1", 1_500, 0), ("s1->h2", 0, 3), ("s1->h3", 3_000, 0),
                                                  ("s1->h4", 0, 0)]
    # A dump the kernel refuses keeps what came before the error.
    root.script = [[qdisc_reply(11, 1, 0) + error_reply(16)]]
    rows.clear()
    s.qdiscs(rows, t0=0.0)
    assert [(r[0], r[3]) for r in rows] == [("s1->h1", 1)]


def test_the_netlink_monitor_samples_queues_before_counters_on_its_two_clocks(monkeypatch):
    calls: list[tuple[str, float]] = []

    class FakeSampler:
        def __init__(self, egress, counters):
            self.n = 0

        def qdiscs(self, rows, t0, now=time.monotonic):
            calls.append(("q", now() - t0))
            rows.append(("a->s1", now() - t0, 0.0, 1500, 0))

        def counters(self):
            calls.append(("l", 0.0))
            self.n += 1
            return {"a->s1": 125_000 * self.n}

        def close(self):
            calls.append(("closed", 0.0))

    monkeypatch.setattr(netlink, "Sampler", FakeSampler)
    mon = Monitor({"a->s1": ("s1-eth1", "rx")}, {"a->s1": ("a-eth0", 1)}, {("a", "s1"): 1e6},
                  interval_s=0.05, qdisc_interval_s=0.01, backend="netlink").start()
    time.sleep(0.32)
    links, qdiscs, cpu = mon.stop()
    assert calls[-1][0] == "closed"
    assert 20 <= len(qdiscs) <= 33 and 4 <= len(links) <= 7 and 2 <= len(cpu) <= 4  # CPU: every 0.1 s at most
    assert list(qdiscs.columns) == ["link", "t", "read_s", "backlog_bytes", "drops"]
    assert list(links.columns) == ["link", "t", "tx_bytes_per_s", "configured_bps"]
    kinds = "".join(k for k, _ in calls[1:-1])  # after the first counter read at start
    assert "ll" not in kinds and kinds.count("l") == len(links)
    assert all(kinds[i - 1] == "q" for i, k in enumerate(kinds) if k == "l")  # each tick: queues, then counters


def test_htb_change_request_decodes_as_tc_would_send_it():
    for bps in (10e6, 100e6, 50e9, 0):
        data = netlink.htb_class_change(12, bps, seq=5)
        m = tcmsg(data)
        m.decode()
        assert (m["header"]["type"], m["header"]["flags"], m["header"]["sequence_number"]) == \
            (netlink.RTM_NEWTCLASS, netlink.NLM_F_REQUEST | netlink.NLM_F_ACK, 5)
        assert (m["index"], m["handle"], m["parent"], m.get_attr("TCA_KIND")) == (12, 0x50001, 0x50000, "htb")
        opts = m.get_attr("TCA_OPTIONS")
        parms = opts.get_attr("TCA_HTB_PARMS")
        rate = tc.rate_bits(bps) // 8
        assert parms["quantum"] == int(tc.QUANTUM) and parms["rate___reserved"] == netlink.TC_LINKLAYER_ETHERNET
        assert parms["rate"] == parms["ceil"] == min(rate, 2 ** 32 - 1)
        assert parms["buffer"] == parms["cbuffer"] == netlink._xmittime(rate, tc.burst_bytes(bps))
        assert opts.get_attr("TCA_HTB_RATE64") == (rate if rate >= 2 ** 32 else None)
    # 100 Mb/s: a 15140-byte burst takes 1211 us, 18921 ticks of 64 ns (tc's arithmetic).
    assert netlink._xmittime(12_500_000, 15140) == int(1211 * netlink._tick_in_usec())


# ---------------------------------------------------------------------------- as root


