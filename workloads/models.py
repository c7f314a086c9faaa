"""Model zoo: the models of the papers' experiments, pure PyTorch, no downloads.

Every model is built identically on every worker from the experiment seed, so all
replicas start from the same parameters. Three presets per model (the demo `cnn` has the
first two):

- `tiny`: for tests (a few thousand parameters, milliseconds per step);
- `small`: for demos on 2 cores (the paper architecture's depth at a fraction of its width);
- `paper`: the full architecture the papers train (VGG-16 138.4M parameters, ResNet-50
  25.6M, AlexNet 61.1M, BERT-base 109.5M, a 2-layer LSTM language model 86.0M).

Replicas must stay bit-identical and equal to one process training on the union of their
batches, so no model keeps training state outside its parameters: no BatchNorm (its
running statistics are buffers that no scheduler synchronises, and its batch statistics
depend on the split of the batch). ResNet uses GroupNorm, BERT LayerNorm (both per sample,
same parameter count as BatchNorm); AlexNet and VGG-16 have no normalisation, as in their
papers. Dropout is left out for the same reason (per-process random masks); it changes
neither the parameters nor the communication.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from workloads.config import MODELS


@dataclass(frozen=True)
class InputSpec:
    """What a model eats and predicts: `image` (shape = C, H, W) or `tokens` (shape =
    sequence length, tokens in [0, vocab)); `lm` models predict the next token of every
    position (classes = vocab), the others one class per sample."""

    kind: str
    shape: tuple[int, ...]
    classes: int
    vocab: int = 0
    lm: bool = False


# ----------------------------------------------------------------------------- cnn
# (conv channels, hidden units)
CNN = {"tiny": ((4, 8), 16), "small": ((16, 32), 64)}


def cnn(preset: str) -> nn.Sequential:
    """Two conv layers and two fully connected ones: the demo model (no paper preset)."""
    (c1, c2), hidden = CNN[preset]
    return nn.Sequential(
        nn.Conv2d(3, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * 8 * 8, hidden), nn.ReLU(),
        nn.Linear(hidden, 10),
    )


def _with_fc_head(model: nn.Sequential, channels: int, pool: int, fc: int, classes: int) -> nn.Sequential:
    """AlexNet's and VGG's head: pool to pool x pool, then three fully connected layers (the
    few huge tensors that make these models interesting to schedule)."""
    model.pool = nn.AdaptiveAvgPool2d(pool)
    model.flatten = nn.Flatten()
    model.classifier = nn.Sequential(
        nn.Linear(channels * pool * pool, fc), nn.ReLU(),
        nn.Linear(fc, fc), nn.ReLU(),
        nn.Linear(fc, classes),
    )
    return model


# ----------------------------------------------------------------------------- alexnet
# conv channels, first conv (kernel, stride, padding), pooled side, fc width, image side, classes
ALEXNET = {
    "tiny": dict(ch=(4, 8, 8, 8, 8), conv1=(3, 1, 1), pool=2, fc=16, side=32, classes=10),
    "small": dict(ch=(24, 64, 96, 64, 64), conv1=(5, 1, 2), pool=3, fc=256, side=32, classes=10),
    "paper": dict(ch=(64, 192, 384, 256, 256), conv1=(11, 4, 2), pool=6, fc=4096, side=224, classes=1000),
}


def alexnet(ch, conv1, pool, fc, classes, **_) -> nn.Module:
    """torchvision's AlexNet (one tower, no LRN, no dropout)."""
    c1, c2, c3, c4, c5 = ch
    k, s, p = conv1
    model = nn.Sequential()
    model.features = nn.Sequential(
        nn.Conv2d(3, c1, k, s, p), nn.ReLU(), nn.MaxPool2d(3, 2),
        nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
        nn.Conv2d(c2, c3, 3, padding=1), nn.ReLU(),
        nn.Conv2d(c3, c4, 3, padding=1), nn.ReLU(),
        nn.Conv2d(c4, c5, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2),
    )
    return _with_fc_head(model, c5, pool, fc, classes)


# ----------------------------------------------------------------------------- vgg
VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")
# width divisor of VGG-16's channels, pooled side, fc width, image side, classes
VGG = {
    "tiny": dict(div=16, pool=1, fc=32, side=32, classes=10),
    "small": dict(div=4, pool=1, fc=512, side=32, classes=10),
    "paper": dict(div=1, pool=7, fc=4096, side=224, classes=1000),
}


def vgg(div, pool, fc, classes, **_) -> nn.Module:
    """VGG-16 (configuration D, no BatchNorm, no dropout): 13 conv and 3 fc layers."""
    layers, c_in = [], 3
    for v in VGG16:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(c_in, v // div, 3, padding=1), nn.ReLU()]
            c_in = v // div
    model = nn.Sequential()
    model.features = nn.Sequential(*layers)
    return _with_fc_head(model, c_in, pool, fc, classes)


# ----------------------------------------------------------------------------- resnet
# bottleneck blocks per stage, base width, GroupNorm groups, stem, image side, classes
RESNET = {
    "tiny": dict(blocks=(1, 1, 1, 1), width=4, groups=2, stem="cifar", side=32, classes=10),
    "small": dict(blocks=(3, 4, 6, 3), width=16, groups=8, stem="cifar", side=32, classes=10),
    "paper": dict(blocks=(3, 4, 6, 3), width=64, groups=32, stem="imagenet", side=224, classes=1000),
}


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck (stride on the 3x3 conv) with GroupNorm."""

    def __init__(self, c_in: int, width: int, stride: int, groups: int):
        super().__init__()
        c_out = width * 4
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.norm1 = nn.GroupNorm(groups, width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.norm2 = nn.GroupNorm(groups, width)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
        self.norm3 = nn.GroupNorm(groups, c_out)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False),
                                            nn.GroupNorm(groups, c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = F.relu(self.norm2(self.conv2(out)))
        out = self.norm3(self.conv3(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


def resnet(blocks, width, groups, stem, classes, **_) -> nn.Module:
    """ResNet-50's layout; the `cifar` stem (3x3 conv, no max-pool) suits 32x32 images."""
    model = nn.Sequential()
    if stem == "imagenet":
        model.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.GroupNorm(groups, width),
                                   nn.ReLU(), nn.MaxPool2d(3, 2, 1))
    else:
        model.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.GroupNorm(groups, width),
                                   nn.ReLU())
    c_in = width
    for stage, n in enumerate(blocks):
        w = width * 2 ** stage
        layer = nn.Sequential()
        for b in range(n):
            layer.append(Bottleneck(c_in, w, 2 if (b == 0 and stage > 0) else 1, groups))
            c_in = w * 4
        model.add_module(f"layer{stage + 1}", layer)
    model.pool = nn.AdaptiveAvgPool2d(1)
    model.flatten = nn.Flatten()
    model.fc = nn.Linear(c_in, classes)
    return model


# ----------------------------------------------------------------------------- bert
BERT = {
    "tiny": dict(vocab=64, d=16, layers=1, heads=2, ff=32, seq=8, max_pos=16, classes=4),
    "small": dict(vocab=1000, d=128, layers=4, heads=2, ff=512, seq=32, max_pos=64, classes=10),
    "paper": dict(vocab=30522, d=768, layers=12, heads=12, ff=3072, seq=128, max_pos=512, classes=2),
}


class Bert(nn.Module):
    """BERT encoder (post-LayerNorm, GELU) with a pooler and a sequence classifier, as in
    fine-tuning on a classification task. Token 0 is [CLS]; token types are all 0."""

    def __init__(self, vocab, d, layers, heads, ff, max_pos, classes, **_):
        super().__init__()
        self.word = nn.Embedding(vocab, d)
        self.position = nn.Embedding(max_pos, d)
        self.token_type = nn.Embedding(2, d)
        self.norm = nn.LayerNorm(d, eps=1e-12)
        # One instance per layer (nn.TransformerEncoder would deep-copy one, so every layer
        # would start from the same weights).
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu", batch_first=True,
                                       layer_norm_eps=1e-12) for _ in range(layers))
        self.pooler = nn.Linear(d, d)
        self.classifier = nn.Linear(d, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.word(tokens) + self.position(positions) + self.token_type(torch.zeros_like(tokens))
        h = self.norm(h)
        for layer in self.layers:
            h = layer(h)
        return self.classifier(torch.tanh(self.pooler(h[:, 0])))


# ----------------------------------------------------------------------------- lstm
LSTM = {
    "tiny": dict(vocab=50, d=16, layers=2, seq=8),
    "small": dict(vocab=1000, d=128, layers=2, seq=32),
    "paper": dict(vocab=33278, d=1500, layers=2, seq=35),   # WikiText-2's vocabulary
}


class LSTMLanguageModel(nn.Module):
    """2-layer LSTM language model with the decoder tied to the embedding (Press & Wolf):
    the embedding weight is used twice per forward, and the decoder bias belongs to this
    (non-leaf) module. Returns next-token logits of every position, (batch * seq, vocab)."""

    def __init__(self, vocab, d, layers, **_):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d)
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        self.lstm = nn.LSTM(d, d, layers, batch_first=True)
        self.decoder_bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embedding(tokens))
        logits = F.linear(h, self.embedding.weight, self.decoder_bias)
        return logits.reshape(-1, logits.shape[-1])


# ----------------------------------------------------------------------------- registry
TABLES = {"cnn": CNN, "alexnet": ALEXNET, "vgg": VGG, "resnet": RESNET, "bert": BERT, "lstm": LSTM}
assert {m: tuple(t) for m, t in TABLES.items()} == {m: presets for m, (_, presets) in MODELS.items()}


def input_spec(model: str, preset: str) -> InputSpec:
    h = TABLES[model][preset]
    if model == "cnn":
        return InputSpec("image", (3, 32, 32), 10)
    if model in ("alexnet", "vgg", "resnet"):
        return InputSpec("image", (3, h["side"], h["side"]), h["classes"])
    if model == "bert":
        return InputSpec("tokens", (h["seq"],), h["classes"], vocab=h["vocab"])
    return InputSpec("tokens", (h["seq"],), h["vocab"], vocab=h["vocab"], lm=True)


def build(model: str, preset: str, seed: int) -> nn.Module:
    """The model with its initial parameters drawn from `seed` (torch's global RNG: build
    models one at a time, never concurrently in threads)."""
    if model not in TABLES:
        raise ValueError(f"unknown model {model!r} (known: {', '.join(TABLES)})")
    if preset not in TABLES[model]:
        raise ValueError(f"unknown preset {preset!r} (known: {', '.join(TABLES[model])})")
    torch.manual_seed(seed)
    if model == "cnn":
        return cnn(preset)
    h = TABLES[model][preset]
    return {"alexnet": alexnet, "vgg": vgg, "resnet": resnet, "bert": Bert, "lstm": LSTMLanguageModel}[model](**h)
