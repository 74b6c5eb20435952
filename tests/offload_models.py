"""Small real models for the offload tests, and a training loop to compare runs."""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, d: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, 2 * d), nn.ReLU(),
                                 nn.Linear(2 * d, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).flatten(1))


class Block(nn.Module):
    """A transformer block: attention, LayerNorm, GELU MLP."""

    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


def inputs(name: str, batch: int = 32) -> tuple[nn.Module, Callable[[int], tuple[torch.Tensor, torch.Tensor]]]:
    """A fresh model (seeded) and a function giving the batch of step i."""
    torch.manual_seed(0)
    if name == "mlp":
        model: nn.Module = MLP()
        shape, classes = (batch, 256), 10
    elif name == "cnn":
        model = CNN()
        shape, classes = (batch, 3, 32, 32), 10
    else:
        model = nn.Sequential(Block(), Block())
        shape, classes = (batch, 32, 64), 0

    def batch_of(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(100 + i)
        x = torch.randn(shape, generator=g)
        y = torch.randint(0, classes, (batch,), generator=g) if classes else torch.randn(shape, generator=g)
        return x, y

    return model, batch_of


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    if y.dtype == torch.long and out.dim() == 3:  # a sequence model's logits
        return nn.functional.cross_entropy(out.flatten(0, 1).float(), y.flatten())
    if y.dtype == torch.long:
        return nn.functional.cross_entropy(out, y)
    return nn.functional.mse_loss(out, y)


def train(model: nn.Module, batch_of: Callable, steps: int,
          ctx: Callable[[], AbstractContextManager] | None = None,
          forward_ctx: Callable[[], AbstractContextManager] | None = None) -> list[list[torch.Tensor]]:
    """Train a copy of ``model`` with Adam (each step in ``ctx``, its forward also in
    ``forward_ctx``: autocast); return every step's gradients, then the final weights."""
    model = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch.manual_seed(1234)  # dropout draws the same in every run
    grads = []
    for i in range(steps):
        x, y = batch_of(i)
        opt.zero_grad()
        with (ctx() if ctx else nullcontext()):
            with (forward_ctx() if forward_ctx else nullcontext()):
                loss = loss_of(model, x, y)
            loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
    grads.append([p.detach().clone() for p in model.parameters()])
    return grads


def assert_same_grads(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> None:
    """Assert two runs of :func:`train` bit-identical: every step's gradients and the final weights."""
    assert len(a) == len(b)
    for step, (ga, gb) in enumerate(zip(a, b, strict=True)):
        for i, (x, y) in enumerate(zip(ga, gb, strict=True)):
            assert torch.equal(x, y), f"step {step}, tensor {i} differs"


def open_handles() -> int:
    """Native handles open now, once garbage left by earlier tests is collected."""
    from pyfastensor import _lib

    gc.collect()
    return _lib.handle_count()


class TinyGPT(nn.Module):
    """A GPT-like model with what recomputation must get right: token embeddings tied to the
    output head, dropout (random draws), LayerNorm, GELU, an in-place ReLU, a residual stream."""

    def __init__(self, vocab: int = 128, d: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "ln": nn.LayerNorm(d), "up": nn.Linear(d, 4 * d), "act": nn.GELU(), "down": nn.Linear(4 * d, d),
            "drop": nn.Dropout(0.1), "gate": nn.Linear(d, d), "relu": nn.ReLU(inplace=True)}) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for b in self.blocks:
            h = b["down"](b["act"](b["up"](b["ln"](x))))
            x = x + b["drop"](h) + b["relu"](b["gate"](x))
        return self.head(self.ln(x))


def gpt_inputs(batch: int = 8, seq: int = 32) -> tuple[nn.Module, Callable[[int], tuple[torch.Tensor, torch.Tensor]]]:
    """A fresh TinyGPT (seeded) and a function giving step i's tokens and targets."""
    torch.manual_seed(0)
    model = TinyGPT()

    def batch_of(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(100 + i)
        ids = torch.randint(0, 128, (batch, seq), generator=g)
        return ids, torch.randint(0, 128, (batch, seq), generator=g)

    return model, batch_of

