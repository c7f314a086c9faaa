"""Training data for every model: seeded synthetic tasks a model can actually learn, and one
small real data set that needs no download (scikit-learn's bundled digits).

What is shared by all workers (class prototypes, the language's transitions, the digits'
train/test split) comes from the experiment seed; each worker draws its batches from its
own stream (seed, rank), so workers see different batches of the same task. `eval_batch()`
is a held-out batch, the same on every worker.
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from workloads.models import InputSpec


def _gen(seed: int, stream: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1000 + stream)


class SyntheticImages:
    """Each class has a fixed random prototype image; a sample is its class prototype plus
    noise. Prototypes are drawn at 32x32 at most and upsampled (a 224x224 prototype per
    class of 1000 would be 600 MB)."""

    def __init__(self, seed: int, rank: int, batch_size: int, shape=(3, 32, 32), classes: int = 10,
                 noise: float = 2.0, eval_size: int = 256):
        c, h, w = shape
        g = torch.Generator().manual_seed(seed)
        self.prototypes = torch.randn((classes, c, min(h, 32), min(w, 32)), generator=g)
        self.gen = _gen(seed, rank + 1)
        self.eval_seed = seed * 1000 + 999_999
        self.batch_size, self.shape, self.classes, self.noise = batch_size, shape, classes, noise
        self.eval_size = eval_size

    def _draw(self, gen: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, self.classes, (n,), generator=gen)
        proto = self.prototypes[y]
        if proto.shape[1:] != self.shape:
            proto = F.interpolate(proto, size=self.shape[1:], mode="nearest")
        return proto + self.noise * torch.randn((n, *self.shape), generator=gen), y

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._draw(self.gen, self.batch_size)

    def eval_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._draw(torch.Generator().manual_seed(self.eval_seed), self.eval_size)


class Digits:
    """scikit-learn's 1,797 8x8 handwritten digits, scaled to the model's image shape
    (nearest neighbour, grey level repeated over the channels) and standardised. A fixed
    split holds out 297 images; workers sample training batches with replacement."""

    HELD_OUT = 297

    def __init__(self, seed: int, rank: int, batch_size: int, shape=(3, 32, 32)):
        from sklearn.datasets import load_digits

        d = load_digits()
        x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1)
        x = (x - x.mean()) / x.std()
        x = F.interpolate(x, size=shape[1:], mode="nearest").expand(-1, shape[0], -1, -1).contiguous()
        y = torch.tensor(d.target, dtype=torch.long)
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
        test, train = order[:self.HELD_OUT], order[self.HELD_OUT:]
        self.train, self.test = (x[train], y[train]), (x[test], y[test])
        self.gen = _gen(seed, rank + 1)
        self.batch_size = batch_size

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        i = torch.randint(0, len(self.train[1]), (self.batch_size,), generator=self.gen)
        return self.train[0][i], self.train[1][i]

    def eval_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.test


class SyntheticSequences:
    """Sequence classification (BERT): each class has a prototype token sequence; a sample
    is its prototype with each token replaced by a random one with probability `noise`.
    Position 0 is always token 0, the [CLS] token the classifier reads."""

    def __init__(self, seed: int, rank: int, batch_size: int, seq_len: int, vocab: int, classes: int,
                 noise: float = 0.5, eval_size: int = 256):
        g = torch.Generator().manual_seed(seed)
        self.prototypes = torch.randint(1, vocab, (classes, seq_len), generator=g)
        self.eval_seed = seed * 1000 + 999_999
        self.gen = _gen(seed, rank + 1)
        self.batch_size, self.vocab, self.classes, self.noise = batch_size, vocab, classes, noise
        self.eval_size = eval_size

    def _draw(self, gen: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, self.classes, (n,), generator=gen)
        x = self.prototypes[y]
        replace = torch.rand(x.shape, generator=gen) < self.noise
        x = torch.where(replace, torch.randint(1, self.vocab, x.shape, generator=gen), x)
        x[:, 0] = 0
        return x, y

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._draw(self.gen, self.batch_size)

    def eval_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._draw(torch.Generator().manual_seed(self.eval_seed), self.eval_size)


class SyntheticText:
    """Language modelling (LSTM): a seeded Markov chain in which every token has 4 likely
    successors, with a uniform jump with probability `noise`. Targets are the next tokens,
    flattened to match the model's (batch * seq, vocab) logits."""

    def __init__(self, seed: int, rank: int, batch_size: int, seq_len: int, vocab: int, noise: float = 0.1,
                 eval_size: int = 256):
        g = torch.Generator().manual_seed(seed)
        self.successors = torch.randint(0, vocab, (vocab, 4), generator=g)
        self.eval_seed = seed * 1000 + 999_999
        self.gen = _gen(seed, rank + 1)
        self.batch_size, self.seq_len, self.vocab, self.noise = batch_size, seq_len, vocab, noise
        self.eval_size = eval_size

    def _draw(self, gen: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.empty((n, self.seq_len + 1), dtype=torch.long)
        tokens[:, 0] = torch.randint(0, self.vocab, (n,), generator=gen)
        for t in range(1, self.seq_len + 1):
            nxt = self.successors[tokens[:, t - 1], torch.randint(0, 4, (n,), generator=gen)]
            jump = torch.rand(n, generator=gen) < self.noise
            tokens[:, t] = torch.where(jump, torch.randint(0, self.vocab, (n,), generator=gen), nxt)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].reshape(-1)

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._draw(self.gen, self.batch_size)

    def eval_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._draw(torch.Generator().manual_seed(self.eval_seed), self.eval_size)


def make(data: str, spec: InputSpec, seed: int, rank: int, batch_size: int, eval_size: int = 256):
    """The data source of `data` ("synthetic" or "digits") shaped for a model's input."""
    if data == "digits":
        if spec.kind != "image":
            raise ValueError("digits is an image data set")
        return Digits(seed, rank, batch_size, spec.shape)
    if spec.kind == "image":
        return SyntheticImages(seed, rank, batch_size, spec.shape, spec.classes, eval_size=eval_size)
    if spec.lm:
        return SyntheticText(seed, rank, batch_size, spec.shape[0], spec.vocab, eval_size=eval_size)
    return SyntheticSequences(seed, rank, batch_size, spec.shape[0], spec.vocab, spec.classes,
                              eval_size=eval_size)
