"""Layer-wise training over a real scheduler on loopback equals plain torch training."""
from __future__ import annotations

import threading

import pytest
import torch

from schedulers import registry
from schedulers.base import Endpoint, RoleContext
from schedulers.server import ParameterServer
from workloads.data import SyntheticImages
from workloads.models import build
from workloads.trainer import LayerwiseSGD

HP = dict(lr=0.01, momentum=0.9, weight_decay=1e-4)
ITERS = 4


def reference(batches_per_rank: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> torch.nn.Module:
    """One process, torch.optim.SGD, on the union of every rank's batch each iteration."""
    model = build("cnn", "tiny", seed=0)
    opt = torch.optim.SGD(model.parameters(), **HP)
    for it in range(ITERS):
        x = torch.cat([b[it][0] for b in batches_per_rank])
        y = torch.cat([b[it][1] for b in batches_per_rank])
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


@pytest.mark.parametrize("scheduler,params,workers", [
    ("fifo", {}, 1), ("fifo", {}, 2), ("bytescheduler", {"partition_numel": 100, "credit_numel": 300}, 2)])
def test_distributed_equals_union_batch(scheduler, params, workers):
    batches = []
    for rank in range(workers):
        data = SyntheticImages(seed=0, rank=rank, batch_size=8)
        batches.append([data.batch() for _ in range(ITERS)])

    ps = ParameterServer(0, workers, "127.0.0.1", 0, accept_timeout_s=20)
    threading.Thread(target=ps.serve, daemon=True).start()
    # Built here, not in the threads: model init draws from torch's global RNG.
    models = {r: build("cnn", "tiny", seed=0) for r in range(workers)}
    trainers, errors = {}, []

    def work(rank):
        try:
            model = models[rank]
            ctx = RoleContext(rank, workers, [Endpoint("lo", "127.0.0.1", ps.port)], connect_timeout_s=20)
            sched = registry.create(scheduler, ctx, params)
            tr = LayerwiseSGD(model, sched, **HP)
            for it in range(ITERS):
                tr.step(*batches[rank][it])
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
    ref = reference(batches)
    for rank in range(workers):
        for (name, p), q in zip(models[rank].named_parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=f"rank {rank} {name}")
    # replicas are bitwise identical: they applied the same averaged buffers
    for rank in range(1, workers):
        for p, q in zip(models[0].parameters(), models[rank].parameters()):
            assert torch.equal(p, q)
    # priorities follow the forward order: first conv layer 0, last linear layer last
    specs = trainers[0].tensors
    assert specs[0].name == "0.weight" and specs[0].priority == 0
    assert specs[-1].name.startswith("9.") and specs[-1].priority == max(s.priority for s in specs)
