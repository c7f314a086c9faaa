"""The model zoo and its data: sizes, seeded construction, shapes, and learnable data."""
from __future__ import annotations

import pytest
import torch

from workloads.config import MODELS
from workloads.data import SyntheticImages, make
from workloads.models import build, input_spec
from workloads.profile import Alone
from workloads.trainer import LayerwiseSGD

ZOO = [(m, p) for m, (_, presets) in MODELS.items() for p in presets]

# The published sizes of the papers' models (torchvision's AlexNet, VGG-16 and ResNet-50;
# BERT-base's encoder and pooler plus a 2-way classifier; our LSTM: 33,278-word vocabulary,
# 1,500 units, tied decoder).
PAPER_PARAMS = {
    "alexnet": 61_100_840,
    "vgg": 138_357_544,
    "resnet": 25_557_032,
    "bert": 109_482_240 + 768 * 2 + 2,
    "lstm": 33_278 * 1500 + 2 * 4 * (2 * 1500 * 1500 + 2 * 1500) + 33_278,
}


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("model", [pytest.param(m, marks=pytest.mark.slow) if m in ("bert", "lstm") else m
                                   for m in sorted(PAPER_PARAMS)])
def test_paper_preset_has_the_published_size(model):
    with torch.device("meta"):   # 0.5 GB for VGG-16 otherwise
        net = build(model, "paper", seed=0)
    assert count(net) == PAPER_PARAMS[model]
    assert not list(net.buffers()), "no training state outside the parameters (no BatchNorm)"


@pytest.mark.parametrize("model,preset", [z for z in ZOO if z[1] != "paper"])
def test_tiny_and_small_presets_fit_their_purpose(model, preset):
    net = build(model, preset, seed=0)
    limit = {"tiny": 100_000, "small": 2_000_000}[preset]
    assert 1_000 < count(net) < limit
    assert not list(net.buffers())
    # Same seed, same model on every worker; another seed, another model.
    again, other = build(model, preset, seed=0), build(model, preset, seed=1)
    for (name, p), q in zip(net.named_parameters(), again.parameters()):
        assert torch.equal(p, q), name
    assert any(not torch.equal(p, r) for p, r in zip(net.parameters(), other.parameters()))


@pytest.mark.parametrize("model", [pytest.param(m, marks=pytest.mark.slow) if m in ("resnet", "vgg") else m
                                   for m in MODELS])
def test_forward_matches_the_data(model):
    spec = input_spec(model, "tiny")
    x, y = make("synthetic", spec, seed=0, rank=0, batch_size=4).batch()
    out = build(model, "tiny", seed=0)(x)
    rows = 4 * spec.shape[0] if spec.lm else 4
    assert out.shape == (rows, spec.classes) and y.shape == (rows,)
    assert int(y.min()) >= 0 and int(y.max()) < spec.classes
    torch.nn.functional.cross_entropy(out, y).backward()


@pytest.mark.parametrize("model", list(MODELS))
def test_data_is_seeded_per_worker(model):
    spec = input_spec(model, "tiny")
    a0, a0_again, a1 = (make("synthetic", spec, 0, r, 8) for r in (0, 0, 1))
    for _ in range(2):
        (x, y), (x2, y2), (x3, _) = a0.batch(), a0_again.batch(), a1.batch()
        assert torch.equal(x, x2) and torch.equal(y, y2)
        assert not torch.equal(x, x3), "workers draw different batches"
    assert torch.equal(a0.eval_batch()[0], a1.eval_batch()[0]), "the held-out batch is the same everywhere"


def test_paper_images_are_full_size_without_full_size_prototypes():
    data = make("synthetic", input_spec("vgg", "paper"), 0, 0, 2)
    x, y = data.batch()
    assert x.shape == (2, 3, 224, 224) and int(y.max()) < 1000
    assert data.prototypes.shape == (1000, 3, 32, 32)


def test_demo_images_unchanged():
    """The demo's 32x32 synthetic images are drawn exactly as before the zoo existed."""
    g = torch.Generator().manual_seed(0)
    prototypes = torch.randn((10, 3, 32, 32), generator=g)
    gen = torch.Generator().manual_seed(0 * 1000 + 1 + 1)
    y = torch.randint(0, 10, (5,), generator=gen)
    x = prototypes[y] + 2.0 * torch.randn((5, 3, 32, 32), generator=gen)
    x2, y2 = SyntheticImages(seed=0, rank=1, batch_size=5).batch()
    assert torch.equal(x, x2) and torch.equal(y, y2)


@pytest.mark.slow
def test_cnn_learns_digits():
    """Real data, no download: on scikit-learn's digits the loss falls and held-out accuracy
    rises well above chance within 40 iterations."""
    torch.set_num_threads(1)
    spec = input_spec("cnn", "small")
    data = make("digits", spec, seed=0, rank=0, batch_size=32)
    tr = LayerwiseSGD(build("cnn", "small", seed=0), Alone(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    before = tr.evaluate(data.eval_batch())
    losses = [tr.step(data.batch()).loss for _ in range(40)]
    tr.finish()
    after = tr.evaluate(data.eval_batch())
    assert len(data.eval_batch()[1]) == 297
    assert sum(losses[-8:]) / 8 < 0.75 * sum(losses[:8]) / 8
    assert before.accuracy < 0.2 and after.accuracy > 0.45
    assert after.loss < 0.7 * before.loss


def test_digits_is_for_image_models_only():
    with pytest.raises(ValueError, match="image data set"):
        make("digits", input_spec("bert", "tiny"), 0, 0, 4)
