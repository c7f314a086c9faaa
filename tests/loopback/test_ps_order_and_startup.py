"""Fair baselines and the start-up cost, over real TCP on 127.0.0.1.

- A PULL-mode server (fifo, bytescheduler) answers in the order the requests arrived, not
  by key; the p3 and mercury servers keep their priority order.
- A fifo worker sends its PUSH and PULL frames first come, first sent.
- `startup_us` makes every message wait that long on its connection's send thread:
  counted per message, at least n x startup_us in all, and the averages stay exact. A
  message is each PUSH and PULL for fifo and bytescheduler, each slice for p3, and for
  mercury one per tensor per iteration per server connection that carries its packets.

To see what an outbox picks, a `PeerGate` holds it before each pick until the test lets it
go: whatever is queued meanwhile competes for the next pick by the outbox's order alone.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from pydantic import ValidationError

from schedulers.core.base import TensorSpec
from schedulers.registry import params_models
from schedulers.transport.connection import Kind, Mode, connect
from schedulers.transport.loop import Peer
from tests.loopback_jobs import SMALL_PARTS, Servers, create, run_job, run_workers

PS_FAMILY = ["fifo", "bytescheduler", "p3", "mercury"]


def wait_until(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


class PeerGate:
    """Holds an outbox served by an I/O loop (a `Peer`: the server's for one worker, a PS
    worker's for one server) before each pick until the test lets it go: the loop picks
    nothing for a peer whose `hold` is 0, and counts `hold` down as it picks."""

    def __init__(self, peer: Peer):
        self.peer = peer
        peer.hold = 0

    def queued(self) -> int:
        return self.peer.queued()

    def let(self, n: int = 1) -> None:
        self.peer.loop.call_soon(self._set, (self.peer.hold or 0) + n)

    def open(self) -> None:
        self.peer.loop.call_soon(self._set, None)

    def _set(self, hold: int | None) -> None:   # on the loop's thread
        self.peer.hold = hold
        self.peer._update()


def record_peer_frames(peer: Peer) -> list[tuple[Kind, int]]:
    """(kind, key) of every frame the peer's outbox writes from now on, in wire order."""
    log: list[tuple[Kind, int]] = []
    on_send = peer.on_send

    def recording(kind, key, chunk, it):
        log.append((kind, key))
        if on_send is not None:
            on_send(kind, key, chunk, it)

    peer.on_send = recording
    return log


def raw_worker(port: int, rank: int, workers: int, mode: Mode):
    conn = connect("127.0.0.1", port, "server 0", 10)
    conn.send(Kind.HELLO, key=workers, chunk=mode, sender=rank)
    return conn


def read_frames(conn, n: int) -> list[tuple[Kind, int]]:
    """n frames; every RESULT's payload must be the average of (key, key): key."""
    out = []
    for _ in range(n):
        h = conn.recv_header()
        if h.kind == Kind.RESULT:
            assert np.array_equal(conn.recv_array(h.nbytes), np.full(100, h.key, np.float32))
        out.append((h.kind, h.key))
    return out


def say_bye(*conns) -> None:
    for conn in conns:
        conn.send(Kind.BYE)
        while conn.recv_header().kind != Kind.BYE:
            pass
        conn.close()


# ---------------------------------------------------------------- server order
@pytest.mark.parametrize("pull_first", [False, True], ids=["slots-complete", "pulls-wait"])
def test_pull_server_answers_in_arrival_order(pull_first):
    """Worker 0 pushes keys 0 and 1, then pulls key 1 before key 0, while its outbox is held;
    released, it answers ACK 0, ACK 1, RESULT 1, RESULT 0: first come, first served. A PULL
    that came before its slot was complete (`pulls-wait`: worker 1 pushes last, key 0
    first) keeps its place. Ordered by key, as before, RESULT 0 would come first."""
    servers = Servers(1, 2, mode=Mode.PULL)
    ps = servers.ps[0]
    w0, w1 = raw_worker(ps.port, 0, 2, Mode.PULL), raw_worker(ps.port, 1, 2, Mode.PULL)
    wait_until(lambda: len(ps.peers) == 2)
    gate = PeerGate(ps.peers[0])

    def push(conn, key):
        conn.send(Kind.PUSH, key=key, it=0, payload=np.full(100, key, np.float32), priority=key)

    if not pull_first:
        push(w1, 0)
        push(w1, 1)
    push(w0, 0)
    push(w0, 1)
    if not pull_first:  # both slots complete: the pulls find results
        wait_until(lambda: all(s.result is not None for s in list(ps.slots.values())) and len(ps.slots) == 2)
    w0.send(Kind.PULL, key=1, it=0, priority=1)
    w0.send(Kind.PULL, key=0, it=0, priority=0)
    if pull_first:
        wait_until(lambda: sum(len(s.waiting) for s in list(ps.slots.values())) == 2)
        push(w1, 0)
        push(w1, 1)
    wait_until(lambda: gate.queued() == 4)
    gate.open()
    assert read_frames(w0, 4) == [(Kind.ACK, 0), (Kind.ACK, 1), (Kind.RESULT, 1), (Kind.RESULT, 0)]
    say_bye(w0, w1)
    servers.join()
    assert not servers.errors, servers.errors


@pytest.mark.parametrize("mode", [Mode.QUEUED, Mode.IMMEDIATE])
def test_p3_and_mercury_servers_keep_their_priority_order(mode):
    """Unchanged by the fair baselines: results queued together go best layer priority first."""
    servers = Servers(1, 1, mode=mode)
    ps = servers.ps[0]
    conn = raw_worker(ps.port, 0, 1, mode)
    wait_until(lambda: len(ps.peers) == 1)
    gate = PeerGate(ps.peers[0])
    for key, prio in ((0, 5), (1, 0)):  # the worse priority arrives first
        conn.send(Kind.PUSH, key=key, it=0, payload=np.full(100, key, np.float32), priority=prio)
    wait_until(lambda: gate.queued() == 2)
    gate.open()
    assert read_frames(conn, 2) == [(Kind.RESULT, 1), (Kind.RESULT, 0)]
    say_bye(conn)
    servers.join()
    assert not servers.errors, servers.errors


# ---------------------------------------------------------------- fifo worker
def test_fifo_worker_sends_first_come_first_sent():
    """Tensors 2, 1, 0 become ready (backward order) and their pushes queue; push 2 goes,
    and its PULL is queued behind pushes 1 and 0, which were queued first. Once
    the PULL carried tensor 2's readiness position and overtook them."""
    servers = Servers(1, 1)
    sched = create("fifo", 0, 1, servers.endpoints)
    sched.start([TensorSpec(k, f"t{k}", 1000, priority=k) for k in range(3)])
    peer = sched.peers[0]
    gate, sent = PeerGate(peer), record_peer_frames(peer)
    for key in (2, 1, 0):
        sched.push(key, np.full(1000, key, np.float32), 0)
    wait_until(lambda: gate.queued() == 3)
    gate.let(1)
    wait_until(lambda: sent == [(Kind.PUSH, 2)])
    wait_until(lambda: gate.queued() == 3)  # pushes 1 and 0, and the PULL of 2
    gate.open()
    for key in range(3):
        assert sched.wait(key, 0)[0] == key
    sched.close()
    servers.join()
    assert not servers.errors, servers.errors
    data = [f for f in sent if f[0] in (Kind.PUSH, Kind.PULL)]
    assert data[:4] == [(Kind.PUSH, 2), (Kind.PUSH, 1), (Kind.PUSH, 0), (Kind.PULL, 2)], data
    assert sorted(data[4:]) == [(Kind.PULL, 0), (Kind.PULL, 1)], data


# ---------------------------------------------------------------- start-up cost
STARTUP = {  # params, and the messages per iteration of tensors of 1000 and 3000, one server
    "fifo": ({}, 2 * 2),                                                      # PUSH + PULL per tensor
    "bytescheduler": ({"partition_numel": 1000, "credit_numel": 2000}, 2 * (1 + 3)),  # per partition
    "p3": ({"slice_numel": 1000}, 1 + 3),                                     # per slice
    "mercury": ({"packet_bytes": 4000}, 2),  # 1 + 3 packets, but one message per tensor
}


@pytest.mark.parametrize("name", PS_FAMILY)
def test_startup_cost_is_paid_by_every_message(name):
    """startup_us = 20 ms: each worker's one connection pays it for each of its K messages,
    one after another, so the job takes at least K x 20 ms; the averages stay exact.
    Mercury's 4 packets are 2 messages: one per tensor."""
    params, per_it = STARTUP[name]
    startup_us, workers, iters = 20_000, 2, 2
    tensors = [TensorSpec(0, "a", 1000, 0), TensorSpec(1, "b", 3000, 1)]
    servers = Servers(1, workers)

    def body(rank):
        sched = create(name, rank, workers, servers.endpoints, {**params, "startup_us": startup_us})
        sched.start(tensors)
        t0, got = time.monotonic(), []
        for it in range(iters):
            for t in reversed(tensors):
                sched.push(t.key, np.full(t.numel, rank + it, np.float32), it)
            got.append([sched.wait(t.key, it).copy() for t in tensors])
        elapsed = time.monotonic() - t0
        sched.close()
        return got, elapsed, sched.info()

    results, errors = run_workers(workers, body)
    assert not errors, errors
    servers.join()
    assert not servers.errors, servers.errors
    k = per_it * iters
    for got, elapsed, info in results.values():
        assert info["startup_us"] == startup_us and info["startup_messages"] == k, info
        assert info["startup_waited_s"] >= k * startup_us / 1e6 - 1e-9, info
        assert elapsed >= k * startup_us / 1e6, (elapsed, k)
        for it in range(iters):
            for t in tensors:
                assert np.array_equal(got[it][t.key], np.full(t.numel, 0.5 + it, np.float32))


def log_payments_and_frames(sched, s: int) -> list:
    """What server s's connection does from now on, in order: "pay" for each start-up cost
    held, (kind, key, chunk) for each frame written."""
    log: list = []
    peer, cost = sched.peers[s], sched.startup[s]
    due, on_send = cost.due, peer.on_send

    def paying(kind, key, chunk, it):
        before = cost.messages
        hold = due(kind, key, chunk, it)
        if cost.messages > before:   # a frame that starts a message pays
            log.append("pay")
        return hold

    def sending(kind, key, chunk, it):
        log.append((kind, key, chunk))
        if on_send is not None:
            on_send(kind, key, chunk, it)

    cost.due, peer.on_send = paying, sending
    return log


def test_mercury_pays_once_per_tensor_per_server():
    """Two servers, tensors of 1, 3 and 5 packets, dealt round-robin: a -> [0], b -> [1, 0, 1],
    c -> [0, 1, 0, 1, 0]. Each tensor pays once per iteration on each server that carries
    any of its packets (a: 1, b: 2, c: 2), right before its first packet there is written;
    its other packets pay nothing. The averages stay exact."""
    startup_us, workers, iters, packet = 5_000, 2, 2, 1000
    tensors = [TensorSpec(0, "a", packet, 0), TensorSpec(1, "b", 3 * packet, 1), TensorSpec(2, "c", 5 * packet, 2)]
    servers = Servers(2, workers)

    def body(rank):
        sched = create("mercury", rank, workers, servers.endpoints,
                       {"packet_bytes": 4 * packet, "startup_us": startup_us})
        sched.start(tensors)
        assert [sched._keys[t.key].servers for t in tensors] == [[0], [1, 0, 1], [0, 1, 0, 1, 0]]
        logs = [log_payments_and_frames(sched, s) for s in range(len(sched.peers))]
        got = []
        for it in range(iters):
            for t in reversed(tensors):
                sched.push(t.key, np.full(t.numel, rank + it, np.float32), it)
            got.append([sched.wait(t.key, it).copy() for t in tensors])
        sched.close()
        return got, sched.info(), [c.messages for c in sched.startup], logs, sched._keys

    results, errors = run_workers(workers, body)
    assert not errors, errors
    servers.join()
    assert not servers.errors, servers.errors
    for got, info, per_server, logs, keys in results.values():
        assert per_server == [3 * iters, 2 * iters], per_server  # server 0: a, b, c; server 1: b, c
        assert info["startup_messages"] == (1 + 2 + 2) * iters, info
        assert info["startup_waited_s"] >= (1 + 2 + 2) * iters * startup_us / 1e6 - 1e-9, info
        for s, log in enumerate(logs):
            pushes = [(i, e) for i, e in enumerate(log) if e != "pay" and e[0] == Kind.PUSH]
            assert len(pushes) == iters * sum(keys[t.key].servers.count(s) for t in tensors)
            for i, (_, key, chunk) in pushes:
                first = chunk == keys[key].servers.index(s)
                assert (i > 0 and log[i - 1] == "pay") == first, (s, log)
            assert log.count("pay") == per_server[s]
        for it in range(iters):
            for t in tensors:
                assert np.array_equal(got[it][t.key], np.full(t.numel, 0.5 + it, np.float32))


@pytest.mark.parametrize("name", PS_FAMILY)
def test_small_startup_cost_keeps_averages_exact(name):
    """Many partitions, 3 workers, 2 servers, a 200 µs cost per message: the job's averages
    equal the reference (run_job checks them, and that replicas are bit-identical)."""
    run_job(name, {**SMALL_PARTS.get(name, {}), "startup_us": 200}, 3, 2, iterations=2)


def test_no_startup_cost_by_default():
    servers = Servers(1, 1)
    sched = create("fifo", 0, 1, servers.endpoints)
    sched.start([TensorSpec(0, "a", 10, 0)])
    sched.push(0, np.ones(10, np.float32), 0)
    sched.wait(0, 0)
    sched.close()
    servers.join()
    assert sched.info() == {} and sched.peers[0].on_send is None and sched.peers[0].delay is None


@pytest.mark.parametrize("value", [-1, 1_000_001, float("inf"), float("nan")])
@pytest.mark.parametrize("name", PS_FAMILY)
def test_startup_us_is_validated(name, value):
    model = params_models()[name]
    with pytest.raises(ValidationError) as e:
        model.model_validate({"startup_us": value})
    assert e.value.errors()[0]["loc"] == ("startup_us",)
    assert model.model_validate({"startup_us": 1_000_000}).startup_us == 1_000_000


def test_collectives_have_no_startup_cost():
    with pytest.raises(ValidationError):
        params_models()["ring"].model_validate({"startup_us": 10})


@pytest.mark.parametrize("name", PS_FAMILY)
def test_zero_startup_cost_is_left_out_of_the_dump(name):
    """Resolved configs, and so the run ids hashed from them, of runs made before
    `startup_us` existed do not change; a cost that is set is kept."""
    model = params_models()[name]
    assert "startup_us" not in model().model_dump(mode="json")
    dumped = model.model_validate({"startup_us": 250}).model_dump(mode="json")
    assert dumped["startup_us"] == 250 and model.model_validate(dumped).startup_us == 250
