"""Built-in models to record traces from: BERT-like, ViT-like and ResNet-like, small and configurable.

Each builder returns the model, one batch (inputs and targets, seeded) and
the loss function the recorder calls as ``loss_fn(model, *batch)``.
Torch is imported inside the builders, so the model names can be listed
(``python -m pyfastensor trace --help``) without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

#: The built-in models, by name.
MODEL_NAMES = ("bert", "vit", "resnet")


@dataclass(frozen=True)
class Workload:
    """A model, one batch of its inputs and targets, and its loss."""

    model: nn.Module
    batch: tuple[torch.Tensor, ...]
    loss_fn: Callable[..., torch.Tensor]


def _classify(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    from torch.nn import functional

    return functional.cross_entropy(model(x), y)


def _encoder(width: int, layers: int, heads: int) -> nn.Module:
    from torch import nn

    layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, dropout=0.0,
                                       activation="gelu", batch_first=True, norm_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


def bert_like(batch: int, *, layers: int = 2, width: int = 64, heads: int = 4, seq: int = 64,
              vocab: int = 1000, classes: int = 2) -> Workload:
    """A BERT-like classifier: token and position embeddings, a pre-norm encoder, a head on token 0.

    The batch is ``batch`` sequences of ``seq`` token ids (CoLA-style, two classes).
    """
    import torch
    from torch import nn

    class Bert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, width)
            self.pos = nn.Parameter(torch.zeros(1, seq, width))
            self.encoder = _encoder(width, layers, heads)
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, classes)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            h = self.encoder(self.tok(ids) + self.pos)
            return self.head(self.norm(h[:, 0]))

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, vocab, (batch, seq), generator=g)
    y = torch.randint(0, classes, (batch,), generator=g)
    return Workload(Bert(), (x, y), _classify)


def vit_like(batch: int, *, layers: int = 2, width: int = 64, heads: int = 4, image: int = 32,
             patch: int = 4, classes: int = 10) -> Workload:
    """A ViT-like classifier: patch embedding (a strided conv), class token, pre-norm encoder, head.

    The batch is ``batch`` RGB images of ``image`` x ``image`` pixels.
    """
    import torch
    from torch import nn

    n = (image // patch) ** 2

    class ViT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.patch = nn.Conv2d(3, width, patch, stride=patch)
            self.cls = nn.Parameter(torch.zeros(1, 1, width))
            self.pos = nn.Parameter(torch.zeros(1, n + 1, width))
            self.encoder = _encoder(width, layers, heads)
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.patch(x).flatten(2).transpose(1, 2)
            h = torch.cat([self.cls.expand(x.shape[0], -1, -1), h], dim=1) + self.pos
            return self.head(self.norm(self.encoder(h)[:, 0]))

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, image, image, generator=g)
    y = torch.randint(0, classes, (batch,), generator=g)
    return Workload(ViT(), (x, y), _classify)


def resnet_like(batch: int, *, layers: int = 2, width: int = 16, image: int = 32,
                classes: int = 10) -> Workload:
    """A ResNet-like classifier: a stem, three stages of ``layers`` basic blocks (conv+BN+ReLU twice,
    a residual add), the channels doubling and the resolution halving per stage, then pooling and a head.
    """
    import torch
    from torch import nn

    class Basic(nn.Module):
        def __init__(self, c_in: int, c: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(c_in, c, 3, stride, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c))
            self.skip = (nn.Identity() if stride == 1 and c_in == c else
                         nn.Sequential(nn.Conv2d(c_in, c, 1, stride, bias=False), nn.BatchNorm2d(c)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.body(x) + self.skip(x))

    blocks: list[nn.Module] = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
    c = width
    for stage in range(3):
        for i in range(layers):
            c_out = width << stage
            blocks.append(Basic(c, c_out, 2 if stage and i == 0 else 1))
            c = c_out
    torch.manual_seed(0)
    model = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, classes))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, image, image, generator=g)
    y = torch.randint(0, classes, (batch,), generator=g)
    return Workload(model, (x, y), _classify)


_BUILDERS: dict[str, Callable[..., Workload]] = {"bert": bert_like, "vit": vit_like, "resnet": resnet_like}


def build(name: str, batch: int, **size: Any) -> Workload:
    """Build the built-in model ``name`` (one of :data:`MODEL_NAMES`) for ``batch``.

    Args:
        name: ``"bert"``, ``"vit"`` or ``"resnet"``.
        batch: the batch size.
        **size: the builder's size options (``layers``, ``width``, ...); None values are left out.

    Raises:
        ValueError: an unknown model name or a batch below 1.
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(MODEL_NAMES)}")
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    return _BUILDERS[name](batch, **{k: v for k, v in size.items() if v is not None})


def record(name: str, batch: int, **size: Any) -> Any:
    """Record the trace of one training step of built-in model ``name`` (Adam, on CPU)."""
    from .record import record_trace

    w = build(name, batch, **size)
    return record_trace(w.model, w.batch, w.loss_fn)
