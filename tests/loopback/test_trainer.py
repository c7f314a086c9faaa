"""Layer-wise training over a real scheduler on loopback equals plain torch training.

Every zoo model (tiny preset) trained by N workers over a real ParameterServer ends with
bitwise-identical replicas, and with the parameters one process reaches with
torch.optim.SGD on the union of their batches. The hooks also cope with what the zoo does:
modules called twice, tied weights, parameters whose owner is never called.
"""
from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import nn

from schedulers import registry
from schedulers.core.base import Endpoint, RoleContext
from schedulers.ps.server import ParameterServer
from workloads.data import make
from workloads.local import free_ports
from workloads.models import build, input_spec
from workloads.profile import Alone
from workloads.trainer import LayerwiseSGD

HP = dict(lr=0.01, momentum=0.9, weight_decay=1e-4)
ITERS = 4
SMALL_PARTS = {"partition_numel": 100, "credit_numel": 300}


def reference(make_model, batches_per_rank) -> nn.Module:
    """One process, torch.optim.SGD, on the union of every rank's batch each iteration."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), **HP)
    for it in range(ITERS):
        x = torch.cat([b[it][0] for b in batches_per_rank])
        y = torch.cat([b[it][1] for b in batches_per_rank])
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def train_distributed(make_model, batches_per_rank, scheduler: str, params: dict) -> dict[int, LayerwiseSGD]:
    workers = len(batches_per_rank)
    if registry.SCHEDULERS[scheduler].Params.requires_servers:
        ps = ParameterServer(0, workers, "127.0.0.1", 0, accept_timeout_s=20)
        threading.Thread(target=ps.serve, daemon=True).start()
        servers, peers = [Endpoint("lo", "127.0.0.1", ps.port)], []
    else:  # a collective: the workers talk to each other
        servers, peers = [], [Endpoint(f"w{i}", "127.0.0.1", p) for i, p in enumerate(free_ports(workers))]
    # Built here, not in the threads: model init draws from torch's global RNG.
    models = {r: make_model() for r in range(workers)}
    trainers, errors = {}, []

    def work(rank):
        try:
            ctx = RoleContext(rank, workers, servers, peers, connect_timeout_s=20)
            sched = registry.create(scheduler, ctx, params)
            tr = LayerwiseSGD(models[rank], sched, **HP)
            for it in range(ITERS):
                tr.step(batches_per_rank[rank][it])
            tr.finish()
            sched.close()
            trainers[rank] = tr
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(workers)]
    torch.set_num_threads(1)
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return trainers


def check_equal(trainers: dict[int, LayerwiseSGD], ref: nn.Module) -> None:
    for rank, tr in trainers.items():
        for (name, p), q in zip(tr.model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=f"rank {rank} {name}")
    # replicas are bitwise identical: they applied the same averaged buffers
    first = trainers[0].model
    for rank in range(1, len(trainers)):
        for (name, p), q in zip(first.named_parameters(), trainers[rank].model.parameters()):
            assert torch.equal(p, q), f"rank {rank} {name} differs from rank 0"
        assert trainers[rank].checksum() == trainers[0].checksum()


def zoo_batches(model: str, workers: int, batch_size: int = 8):
    spec = input_spec(model, "tiny")
    return [[make("synthetic", spec, 0, rank, batch_size).batch() for _ in range(ITERS)] for rank in range(workers)]


@pytest.mark.parametrize("scheduler,params,workers", [
    pytest.param("fifo", {}, 1, marks=pytest.mark.slow), ("fifo", {}, 2),
    pytest.param("bytescheduler", SMALL_PARTS, 2, marks=pytest.mark.slow), ("p3", {"slice_numel": 100}, 2),
    ("mercury", {"packet_bytes": 256}, 2), ("ring", {"chunk_kb": 1}, 3),
    pytest.param("forest", {"chunk_numel": 64}, 3, marks=pytest.mark.slow)])
def test_cnn_distributed_equals_union_batch(scheduler, params, workers):
    batches = zoo_batches("cnn", workers)
    trainers = train_distributed(lambda: build("cnn", "tiny", seed=0), batches, scheduler, params)
    check_equal(trainers, reference(lambda: build("cnn", "tiny", seed=0), batches))
    # priorities follow the forward order: first conv layer 0, last linear layer last
    specs = trainers[0].tensors
    assert specs[0].name == "0.weight" and specs[0].priority == 0
    assert specs[-1].name.startswith("9.") and specs[-1].priority == max(s.priority for s in specs)


@pytest.mark.parametrize("model,scheduler", [
    ("alexnet", "fifo"),
    pytest.param("vgg", "bytescheduler", marks=pytest.mark.slow),
    pytest.param("resnet", "fifo", marks=pytest.mark.slow),
    pytest.param("resnet", "bytescheduler", marks=pytest.mark.slow),
    pytest.param("bert", "fifo", marks=pytest.mark.slow),
    pytest.param("bert", "bytescheduler", marks=pytest.mark.slow),
    pytest.param("lstm", "fifo", marks=pytest.mark.slow),
    pytest.param("lstm", "bytescheduler", marks=pytest.mark.slow),
    pytest.param("alexnet", "mercury", marks=pytest.mark.slow),
    pytest.param("vgg", "p3", marks=pytest.mark.slow),
    ("resnet", "ring"),
    pytest.param("lstm", "forest", marks=pytest.mark.slow)])
def test_zoo_distributed_equals_union_batch(model, scheduler):
    batches = zoo_batches(model, workers=2)
    params = SMALL_PARTS if scheduler == "bytescheduler" else {}
    trainers = train_distributed(lambda: build(model, "tiny", seed=0), batches, scheduler, params)
    check_equal(trainers, reference(lambda: build(model, "tiny", seed=0), batches))
    names = {t.name for t in trainers[0].tensors}
    assert names == {n for n, _ in trainers[0].model.named_parameters()}


class Awkward(nn.Module):
    """Everything the zoo does to the hooks, in one model: a module called twice (`block`),
    a weight tied between two modules (`embed` and `out`), a parameter owned by this
    non-leaf module (`scale`), a submodule whose owner is never called (`attn.proj` is
    read by `attn`), and children registered in a different order than they run."""

    def __init__(self):
        super().__init__()
        self.out = nn.Linear(8, 5)           # registered first, runs last
        self.attn = Mixer(8)
        self.block = nn.Linear(8, 8)
        self.embed = nn.Embedding(5, 8)
        self.out.weight = self.embed.weight   # tied
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, tokens):
        h = self.embed(tokens).mean(1) * self.scale
        h = torch.tanh(self.block(h))
        h = self.attn(h)
        h = torch.tanh(self.block(h))        # the same module again
        return self.out(h)


class Mixer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.gate = nn.Parameter(torch.full((d,), 0.5))

    def forward(self, h):
        return h + self.gate * nn.functional.linear(h, self.proj.weight, self.proj.bias)  # proj never called


def awkward_batches(workers: int):
    g = torch.Generator().manual_seed(1)
    return [[(torch.randint(0, 5, (6, 3), generator=g), torch.randint(0, 5, (6,), generator=g))
             for _ in range(ITERS)] for _ in range(workers)]


def make_awkward():
    torch.manual_seed(0)
    return Awkward()


@pytest.mark.parametrize("scheduler", ["fifo", "bytescheduler"])
def test_awkward_model_equals_union_batch(scheduler):
    batches = awkward_batches(2)
    params = {"partition_numel": 7, "credit_numel": 20} if scheduler == "bytescheduler" else {}
    trainers = train_distributed(make_awkward, batches, scheduler, params)
    check_equal(trainers, reference(make_awkward, batches))
    tr = trainers[0]
    # Layers in execution order, each parameter waited for once, where it is first needed.
    assert tr.layer_names == ["(model)", "embed", "block", "attn", "out"]
    prio = {t.name: t.priority for t in tr.tensors}
    assert prio["scale"] == 0                     # owned by the model: waited for at its start
    assert prio["out.weight"] == 1                # tied to embed.weight: waited for at its first use
    assert prio["block.weight"] == prio["block.bias"] == 2
    assert prio["attn.gate"] == prio["attn.proj.weight"] == prio["attn.proj.bias"] == 3
    assert prio["out.bias"] == 4
    assert len(tr.tensors) == len(list(tr.model.parameters())) == 8


class Sometimes(nn.Module):
    """Every other forward uses `lin`'s parameters without calling `lin` (data-dependent
    control flow): its update must still be applied in every iteration."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = self.lin(x) if self.calls % 2 else nn.functional.linear(x, self.lin.weight, self.lin.bias)
        return self.head(torch.relu(h))


def test_layer_skipped_by_control_flow_is_still_updated():
    g = torch.Generator().manual_seed(2)
    batches = [[(torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)) for _ in range(ITERS)]
               for _ in range(2)]

    def make_sometimes():
        torch.manual_seed(0)
        return Sometimes()

    check_equal(train_distributed(make_sometimes, batches, "fifo", {}), reference(make_sometimes, batches))


def test_unused_parameter_is_an_error_not_a_hang():
    class Spare(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Linear(4, 3)
            self.spare = nn.Linear(4, 4)  # never used in forward: no gradient

        def forward(self, x):
            return self.used(x)

    tr = LayerwiseSGD(Spare(), Alone(), **HP)
    with pytest.raises(RuntimeError, match=r"no gradient for \['spare.weight', 'spare.bias'\]"):
        tr.step((torch.randn(2, 4), torch.tensor([0, 1])))


def test_waits_and_times_are_recorded_per_layer():
    model = build("cnn", "tiny", seed=0)
    data = make("synthetic", input_spec("cnn", "tiny"), 0, 0, 8)
    tr = LayerwiseSGD(model, Alone(), **HP)
    unaccounted = []
    for it in range(3):
        wait_before = tr.wait_s
        t0 = time.perf_counter()
        tr.step(data.batch())
        step_s = time.perf_counter() - t0
        tm = tr.timing
        # The timeline lies within the step, and covers it: a tiny step is ~3 ms, so a
        # scheduler preemption between our clock and the trainer's can miss one of them.
        accounted = tm.lead_s + sum(tm.wait_s) + sum(tm.forward_s) + sum(g for _, g in tm.ready) + tm.tail_s
        assert accounted <= step_s + 1e-6
        unaccounted.append(step_s - accounted - max(0.05 * step_s, 5e-4))
        assert len(tm.wait_s) == len(tm.forward_s) == len(tm.backward_s) == len(tr.layer_names) == 4
        assert sum(tm.wait_s) == pytest.approx(tr.wait_s - wait_before)
        assert all(f > 0 for f in tm.forward_s) and all(b > 0 for b in tm.backward_s)
        assert sorted(k for k, _ in tm.ready) == list(range(len(tr.tensors)))
        rows = tm.rows(rank=0, iteration=it, layer_names=tr.layer_names)
        assert [r["name"] for r in rows] == ["0", "3", "7", "9"]
        # backward produces the output side first
        assert tr.tensors[tm.ready[0][0]].priority == 3
    assert min(unaccounted) <= 0, unaccounted
