"""P3 and Mercury over real TCP on 127.0.0.1: priority seen in event traces, the server's
receive-side priority queue, modes, buffer reuse, and failure of any role (no mocks)."""
from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from contracts.role_spec import Address, role_specs
from schedulers.core.base import CommError, Endpoint, TensorSpec
from schedulers.transport.connection import (
    AUTO,
    HEADER,
    INITIAL_LOWAT,
    QUEUE_S,
    SO_MAX_PACING_RATE,
    Connection,
    Kind,
    Mode,
    Outbox,
    connect,
)
from tests.conftest import REPO
from tests.loopback_jobs import Servers, create, run_workers

KiB = 1024


# ---------------------------------------------------------------- helpers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_process(procs, tmp_path, rank: int, ports: list[int], workers: int, name: str,
                   params: dict | None = None) -> subprocess.Popen:
    specs = role_specs([Address(host="lo", ip="127.0.0.1", port=p) for p in ports],
                       [Address(host="lo", ip="127.0.0.1", port=0)] * workers, seed=0, scheduler=name,
                       params=params or {}, workload={}, out_dir=tmp_path, connect_timeout_s=20, iface="lo")
    path = tmp_path / f"server{rank}.json"
    path.write_text(specs[rank].to_json())
    procs.append(subprocess.Popen([sys.executable, "-m", "workloads.server", str(path)], cwd=REPO,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    return procs[-1]


PARAMS = {"p3": {"slice_numel": 4096}, "mercury": {"packet_bytes": 16 * KiB}}


# ---------------------------------------------------------------- transport
@pytest.mark.slow
def test_kernel_send_queue_is_bounded_by_time():
    """Against a reader that drains 20 Mb/s, the adaptive TCP_NOTSENT_LOWAT comes down from
    its initial 1 MiB to about QUEUE_S of that rate, and the kernel really holds no more
    unsent bytes than that (plus one segment being built); by default it would hold MBs."""
    rate = 20e6 / 8
    lsock = socket.create_server(("127.0.0.1", 0))
    sender = Connection(socket.create_connection(lsock.getsockname()), "reader", notsent_lowat=AUTO)
    reader, _ = lsock.accept()
    stop = threading.Event()

    def drain():
        buf, next_t = bytearray(16 * KiB), time.monotonic()
        while not stop.is_set():
            n = reader.recv_into(buf)
            next_t = max(next_t, time.monotonic() - 0.005) + n / rate
            time.sleep(max(0.0, next_t - time.monotonic()))

    threading.Thread(target=drain, daemon=True).start()
    outbox = Outbox(sender, lambda e: None)
    payload = np.zeros(4 * KiB, np.float32)
    outbox.put_many([((0, 0, c), Kind.PUSH, 0, c, 0, payload, 0, None) for c in range(200)])  # 3.2 MB
    notsent = []
    for _ in range(12):
        time.sleep(0.05)
        info = sender.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
        notsent.append(struct.unpack_from("=I", info, 144)[0])  # tcpi_notsent_bytes
    lowat = sender.lowat
    stop.set()
    outbox.abort("done")
    reader.close()
    lsock.close()
    assert lowat < INITIAL_LOWAT / 4 and lowat <= 4 * rate * QUEUE_S, lowat
    assert max(notsent[-4:]) <= lowat + 64 * KiB, (notsent, lowat)


# ---------------------------------------------------------------- correctness
@pytest.mark.parametrize("name,params", [("p3", {"slice_numel": 1000}),
                                         pytest.param("mercury", {"packet_bytes": 4 * 37}, marks=pytest.mark.slow)])
def test_many_slices_over_servers_average_exactly(name, params):
    """Odd sizes cut into many slices/packets, spread over 3 servers, several iterations."""
    sizes, workers, iters = [1, 37, 999, 1000, 1001, 12_345], 3, 3
    tensors = [TensorSpec(k, f"t{k}", n, priority=len(sizes) - k) for k, n in enumerate(sizes)]
    rng = np.random.default_rng(1)
    grads = [[[rng.standard_normal(n).astype(np.float32) for n in sizes] for _ in range(workers)]
             for _ in range(iters)]
    servers = Servers(3, workers)

    def body(rank):
        sched = create(name, rank, workers, servers.endpoints, params)
        sched.start(tensors)
        got = []
        for it in range(iters):
            for t in tensors:
                sched.push(t.key, grads[it][rank][t.key].copy(), it)
            got.append([sched.wait(t.key, it).copy() for t in tensors])
        sched.close()
        return got

    results, errors = run_workers(workers, body)
    assert not errors, errors
    servers.join()
    assert not servers.errors, servers.errors
    for it in range(iters):
        for t in tensors:
            ref = np.mean([grads[it][r][t.key].astype(np.float64) for r in range(workers)], axis=0)
            for r in range(workers):
                np.testing.assert_allclose(results[r][it][t.key], ref, rtol=1e-5, atol=1e-6)
    # every server took part
    assert all(ps.pool.allocated > 0 for ps in servers.ps)


def test_server_reuses_buffers_across_iterations():
    """Pushes land in pooled buffers: allocations stop growing after the first iterations
    instead of growing with iterations x workers x packets."""
    workers, iters, numel = 2, 8, 64 * KiB
    packets = numel * 4 // (16 * KiB)
    servers = Servers(1, workers)

    def body(rank):
        sched = create("mercury", rank, workers, servers.endpoints)
        sched.start([TensorSpec(0, "w", numel, 0)])
        for it in range(iters):
            sched.push(0, np.full(numel, rank + it, np.float32), it)
            assert sched.wait(0, it)[0] == 0.5 + it
        sched.close()

    _, errors = run_workers(workers, body)
    assert not errors, errors
    servers.join()
    # Without the pool this would be iters * workers * packets = 256. How many are alive at
    # once depends on how the two workers' packets interleave (a slot completed and sent
    # before the next packet lands frees its buffer), so only the ceiling is deterministic.
    allocated = servers.ps[0].pool.allocated
    assert 1 <= allocated <= 4 * packets, (allocated, packets)


# ---------------------------------------------------------------- priority in traces
@pytest.mark.slow
@pytest.mark.parametrize("name", ["mercury", "p3"])
def test_lower_layer_ready_during_send_goes_next(name):
    """A layer nearer the input that becomes ready while a later layer's packets are being
    sent goes out next, within one packet (P3: one slice), and its results come back before
    the later layer's."""
    unit = PARAMS[name].get("slice_numel") or PARAMS[name]["packet_bytes"] // 4
    low, high = TensorSpec(0, "conv1", 8 * unit, priority=0), TensorSpec(1, "fc", 1500 * unit, priority=1)
    servers = Servers(1, 1)
    sched = create(name, 0, 1, servers.endpoints, PARAMS[name], trace=True)
    sched.start([low, high])

    def high_sends():
        return sum(1 for e in sched.events if e[0] == "send" and e[1] == high.key)

    sched.push(high.key, np.ones(high.numel, np.float32), 0)
    deadline = time.monotonic() + 10
    while high_sends() < 3 and time.monotonic() < deadline:
        time.sleep(0.0002)
    sched.push(low.key, np.ones(low.numel, np.float32), 0)
    t_ready = time.time()  # its packets are in the outbox: any later pick must be one of them
    sched.wait(low.key, 0)
    sched.wait(high.key, 0)
    sched.close()
    servers.join()

    sends = [(e[1], e[2], e[4]) for e in sched.events if e[0] == "send"]
    first_low = next(i for i, s in enumerate(sends) if s[0] == low.key)
    last_low = max(i for i, s in enumerate(sends) if s[0] == low.key)
    # at most the packet being picked while push() ran may still carry the later layer
    overtaken = [s for s in sends[:first_low] if s[2] >= t_ready]
    assert len(overtaken) <= 1, f"{len(overtaken)} packets of the later layer went out after the earlier was ready"
    assert all(s[0] == low.key for s in sends[first_low:last_low + 1]), "the earlier layer was interleaved"
    assert any(s[0] == high.key for s in sends[last_low + 1:]), "premise: the later layer was still being sent"
    assert [s[1] for s in sends if s[0] == high.key] == list(range(1500)), "a layer's packets go in order"

    recvs = [(e[1], e[2]) for e in sched.events if e[0] == "recv"]
    last_low_recv = max(i for i, r in enumerate(recvs) if r[0] == low.key)
    assert any(r[0] == high.key for r in recvs[last_low_recv + 1:]), "results: earlier layer not before later"


def test_p3_server_sums_received_slices_by_priority():
    """P3's server-side queue: pushes that arrive while the server is busy are summed best
    priority first, whatever their arrival order. The server reads what one round of its
    loop finds before it sums, so the test writes all six pushes in one send (one segment on
    loopback), worst priority first, speaking the wire protocol directly."""
    servers = Servers(1, 1, mode=Mode.QUEUED, trace=True)
    ps = servers.ps[0]
    conn = connect("127.0.0.1", ps.port, "server 0", 10)
    conn.send(Kind.HELLO, key=1, chunk=Mode.QUEUED, sender=0)
    prios = [5, 4, 3, 2, 1, 0]  # worst first, as backward produces them
    frames = b"".join(HEADER.pack(Kind.PUSH, 0, 0, key, 0, 0, prio, 400) + np.full(100, key, np.float32).tobytes()
                      for key, prio in enumerate(prios))
    conn.sock.sendall(frames)
    results = {}
    for _ in prios:
        h = conn.recv_header()
        assert h.kind == Kind.RESULT
        results[h.key] = conn.recv_array(h.nbytes)
    conn.send(Kind.BYE)
    assert conn.recv_header().kind == Kind.BYE
    conn.close()
    servers.join()
    assert not servers.errors, servers.errors
    done = [prios[e[1]] for e in ps.events if e[0] == "done"]
    assert done == sorted(done) and len(done) == len(prios), done
    assert all(np.array_equal(results[k], np.full(100, k, np.float32)) for k in range(len(prios)))


# ---------------------------------------------------------------- modes
@pytest.mark.slow
def test_server_process_takes_its_mode_from_the_spec(procs, tmp_path):
    """`python -m workloads.server SPEC.json` serves the spec's scheduler and refuses
    workers that speak another one, naming both; the worker fails, it does not hang."""
    port = free_port()
    proc = server_process(procs, tmp_path, 0, [port], 1, "p3")
    eps = [Endpoint("lo", "127.0.0.1", port)]
    sched = create("mercury", 0, 1, eps)
    sched.start([TensorSpec(0, "w", 10, 0)])
    with pytest.raises(CommError, match="speaks IMMEDIATE but this server runs QUEUED"):
        sched.push(0, np.ones(10, np.float32), 0)  # raises here if the ABORT is already in
        sched.wait(0, 0)
    assert proc.wait(timeout=10) == 1
    assert "speaks IMMEDIATE" in proc.stderr.read()

    port = free_port()
    proc = server_process(procs, tmp_path, 0, [port], 1, "mercury")
    sched = create("mercury", 0, 1, [Endpoint("lo", "127.0.0.1", port)])
    sched.start([TensorSpec(0, "w", 10, 0)])
    sched.push(0, np.arange(10, dtype=np.float32), 0)
    assert np.array_equal(sched.wait(0, 0), np.arange(10, dtype=np.float32))
    sched.close()
    assert proc.wait(timeout=10) == 0


# ---------------------------------------------------------------- failure
TENSORS = [TensorSpec(0, "a", 5000, 0), TensorSpec(1, "b", 20_000, 1)]
DEADLINE_S = 5.0  # every surviving role must have failed this long after the death

WORKER_PROGRAM = """
import json, sys, time
import numpy as np
from schedulers import registry
from schedulers.core.base import Endpoint, RoleContext, TensorSpec
a = json.loads(sys.argv[1])
ctx = RoleContext(a["rank"], a["workers"], [Endpoint(**e) for e in a["servers"]], connect_timeout_s=20)
sched = registry.create(a["name"], ctx, a["params"])
sched.start([TensorSpec(**t) for t in a["tensors"]])
for t in a["tensors"]:
    sched.push(t["key"], np.ones(t["numel"], np.float32), 0)
for t in a["tensors"]:
    sched.wait(t["key"], 0)
print("ready", flush=True)
time.sleep(60)
"""


def _survivor(name, rank, workers, eps, ready: threading.Barrier, hold: threading.Event | None = None):
    """Iteration 0 with everyone; then iteration 1, which needs the peer that dies. With
    `hold`, iteration 1 starts only once the peer is dead (the others block in wait)."""
    sched = create(name, rank, workers, eps, PARAMS[name])
    sched.start(TENSORS)
    for t in TENSORS:
        sched.push(t.key, np.ones(t.numel, np.float32), 0)
    for t in TENSORS:
        sched.wait(t.key, 0)
    ready.wait(20)
    if hold is not None:
        hold.wait(20)
    try:
        for t in TENSORS:
            sched.push(t.key, np.ones(t.numel, np.float32), 1)
        for t in TENSORS:
            sched.wait(t.key, 1)
    except CommError as e:
        return time.monotonic(), str(e)
    raise AssertionError("iteration 1 completed without the dead peer")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["p3", "mercury"])
def test_dead_server_makes_every_worker_fail_naming_it(name, procs, tmp_path):
    """Server 0 (a real process) is killed with SIGKILL while worker 0 waits for iteration 1;
    both workers raise CommError naming it, and server 1 exits with status 1."""
    ports = [free_port(), free_port()]
    servers = [server_process(procs, tmp_path, s, ports, 2, name, PARAMS[name]) for s in range(2)]
    eps = [Endpoint("lo", "127.0.0.1", p) for p in ports]
    ready, died = threading.Barrier(3), threading.Event()
    killed_at = {}

    def killer():
        ready.wait(20)
        time.sleep(0.2)  # worker 0 is blocked in wait(it=1)
        killed_at["t"] = time.monotonic()
        servers[0].send_signal(signal.SIGKILL)
        died.set()

    threading.Thread(target=killer, daemon=True).start()
    results, errors = run_workers(2, lambda rank: _survivor(name, rank, 2, eps, ready, died if rank else None))
    assert not errors, errors
    for t_fail, msg in results.values():
        assert "server 0" in msg, msg
        assert t_fail - killed_at["t"] < DEADLINE_S
    # the surviving server learns it from the workers and exits with an error, too
    assert servers[1].wait(timeout=DEADLINE_S) == 1
    assert "server 0" in servers[1].stderr.read()
    servers[0].wait(timeout=5)


@pytest.mark.parametrize("name", ["p3", "mercury"])
@pytest.mark.slow
def test_dead_worker_makes_servers_and_workers_fail_naming_it(name, procs, tmp_path):
    """Worker 2 (a real process) is killed with SIGKILL after iteration 0; both server
    processes exit with status 1 and the surviving workers raise CommError, all naming it."""
    ports = [free_port(), free_port()]
    servers = [server_process(procs, tmp_path, s, ports, 3, name, PARAMS[name]) for s in range(2)]
    eps = [Endpoint("lo", "127.0.0.1", p) for p in ports]
    args = {"rank": 2, "workers": 3, "name": name, "params": PARAMS[name],
            "servers": [{"host": "lo", "ip": "127.0.0.1", "port": p} for p in ports],
            "tensors": [t.__dict__ for t in TENSORS]}
    victim = subprocess.Popen([sys.executable, "-c", WORKER_PROGRAM, json.dumps(args)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    procs.append(victim)
    ready = threading.Barrier(3)
    killed_at = {}

    def killer():
        assert victim.stdout.readline().strip() == "ready"
        ready.wait(20)
        time.sleep(0.2)  # the survivors are blocked in wait(it=1)
        killed_at["t"] = time.monotonic()
        victim.send_signal(signal.SIGKILL)

    threading.Thread(target=killer, daemon=True).start()
    results, errors = run_workers(2, lambda rank: _survivor(name, rank, 3, eps, ready))
    assert not errors, errors
    for t_fail, msg in results.values():
        assert "worker 2" in msg, msg
        assert t_fail - killed_at["t"] < DEADLINE_S
    for proc in servers:
        assert proc.wait(timeout=DEADLINE_S) == 1
        assert "worker 2" in proc.stderr.read()
    victim.wait(timeout=5)


# ---------------------------------------------------------------- incast: pacing to the server's share
@pytest.mark.parametrize("name,paces", [("mercury", True), ("fifo", False)])
def test_worker_paces_to_the_share_its_server_sends(name, paces):
    """The server's CTRL frame (key: a share of its link, bytes/s; schedulers/ps/share.py) sets
    the pacing rate of a pacing worker's connection (mercury by default), and a baseline
    ignores it. The server here speaks the wire protocol directly."""
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    got: dict = {}

    def server():
        sock, _ = lsock.accept()
        conn = Connection(sock, "worker 0")
        got["hello"] = conn.recv_header()
        conn.send(Kind.CTRL, key=1_234_567)
        while conn.recv_header().kind != Kind.BYE:
            pass
        conn.send(Kind.BYE)
        conn.close()

    th = threading.Thread(target=server, daemon=True)
    th.start()
    sched = create(name, 0, 1, [Endpoint("lo", "127.0.0.1", port)])
    sched.start([TensorSpec(0, "w", 10, 0)])
    deadline = time.monotonic() + 10
    while paces and not sched.paced and time.monotonic() < deadline:
        time.sleep(0.01)
    rate = sched.peers[0].sock.getsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE)
    info = sched.info()
    sched.close()
    th.join(10)
    lsock.close()
    if paces:
        assert rate == 1_234_567 and info == {"pace_bytes_per_s": {0: 1_234_567}, "pace_updates": 1}
    else:
        assert rate != 1_234_567 and "pace_bytes_per_s" not in info
