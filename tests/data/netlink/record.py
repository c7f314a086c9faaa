"""Records kernel replies into recorded.json beside this file, for tests/unit/test_netlink.py.

    sudo .venv/bin/python tests/data/netlink/record.py

Creates network namespaces slrecA and slrecB joined by a veth pair (slrecx, slrecy),
shapes slrecx with emu/testbed/tc.py's setup at its minimum rate, queues 20 UDP datagrams in it, records the
replies to emu/testbed/netlink.py's requests with what tc and ip print right after, and removes all
of it.
"""
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from emu.testbed import netlink, tc

HERE = Path(__file__).resolve().parent

A, B, DA, DB = "slrecA", "slrecB", "slrecx", "slrecy"


def sh(*args: str, check: bool = True) -> str:
    return subprocess.run(list(args), check=check, capture_output=True, text=True).stdout


def nsx(ns: str, *args: str) -> str:
    return sh("ip", "netns", "exec", ns, *args)


def udp_burst(ns: str, dst: str, count: int) -> None:
    """`count` 1442-byte frames (1400 bytes of UDP payload) to dst from inside ns (a fresh
    machine has no ping)."""
    code = ("import socket,sys; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "for _ in range(int(sys.argv[2])): s.sendto(bytes(1400), (sys.argv[1], 9))")
    subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code, dst, str(count)], check=True,
                   capture_output=True, timeout=30)


def record() -> dict:
    for ns in (A, B):
        sh("ip", "netns", "add", ns)
        nsx(ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
    sh("ip", "link", "add", DA, "netns", A, "type", "veth", "peer", "name", DB, "netns", B)
    for ns, dev, addr in ((A, DA, "10.77.2.1/24"), (B, DB, "10.77.2.2/24")):
        nsx(ns, "ip", "addr", "add", addr, "dev", dev)
        nsx(ns, "ip", "link", "set", dev, "up")
        nsx(ns, "ip", "link", "set", "lo", "up")
    for cmd in tc.setup_commands(DA, 0, queue_ms=20):
        nsx(A, *cmd)
    udp_burst(A, "10.77.2.2", 20)
    udp_burst(A, "127.0.0.1", 3)
    time.sleep(0.2)
    (sock, index), = netlink.open_sockets({f"/run/netns/{A}": [DA, "lo"]}).values()
    buf = bytearray(1 << 16)
    try:
        sock.send(netlink.qdisc_request(index[DA]))
        qdisc = bytes(buf[:sock.recv_into(buf)])
        by_tc = next(q for q in json.loads(nsx(A, "tc", "-s", "-j", "qdisc", "show", "dev", DA)) if q.get("root"))
        sock.send(netlink.link_stats_request())
        parts = []
        while True:
            n = sock.recv_into(buf)
            parts.append(bytes(buf[:n]))
            if any(m.type == netlink.NLMSG_DONE for m in netlink.messages(buf, n)):
                break
        links = json.loads(nsx(A, "ip", "-s", "-j", "link", "show"))
    finally:
        sock.close()
    return {"how": f"Linux {platform.release()}: a network namespace with lo and one end of a veth pair, the veth "
                   "shaped by emu/testbed/tc.py's setup at 8 bit/s and 20 UDP datagrams of 1442-byte frames sent into "
                   "it (the first pass, the rest stay queued); the replies to emu/testbed/netlink.py's "
                   "qdisc_request(veth) and link_stats_request(), with what `tc -s -j qdisc show` and "
                   "`ip -s -j link show` printed right after (tests/data/netlink/record.py)",
            "qdiscs": [{"hex": qdisc.hex(), "tc": {k: by_tc[k] for k in ("backlog", "drops", "qlen")}}],
            "link_stats": {"hex": b"".join(parts).hex(),
                           "ip": {str(x["ifindex"]): [x["stats64"]["rx"]["bytes"], x["stats64"]["tx"]["bytes"]]
                                  for x in links}}}


if __name__ == "__main__":
    try:
        rec = record()
    finally:
        for ns in (A, B):
            sh("ip", "netns", "del", ns, check=False)
    (HERE / "recorded.json").write_text(json.dumps(rec, indent=1) + "\n")
    print(json.dumps(rec["qdiscs"][0]["tc"]), json.dumps(rec["link_stats"]["ip"]))
