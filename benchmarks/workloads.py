"""The workload models every benchmark (and every test that needs a model) builds.

Three kinds, all seeded, torch imported only inside the builders (so
``python -m benchmarks --help`` lists them without it):

- state dicts to save and load (``benchmarks checkpoint``, ``dcp``):
  :func:`gpt2_state_dict` (GPT-2 small by default, 498 MB),
  :func:`resnet50_state_dict` (ResNet-50, 102 MB) and
  :func:`small_state_dict` (many 4-64 KiB tensors) and
  :func:`lora_state_dict` (a LoRA adapter's few hundred 16-256 KiB tensors), named by
  :data:`STATE_DICTS` and built by :func:`build_state_dicts`;
- classifiers to train (``benchmarks offload``, ``plan --runtime``,
  ``data --convergence``): :func:`deep_mlp`, :func:`conv_net`,
  :func:`small_cnn`, the first two wrapped with their inputs in
  :class:`TrainWorkload` (:func:`train_workloads`: the benchmark's sizes);
- models to record G10 traces from (``benchmarks plan``, ``trace``): BERT-,
  ViT- and ResNet-like classifiers with one batch and their loss
  (:data:`MODEL_NAMES`, :func:`build`, :func:`record`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

StateDict = dict[str, "torch.Tensor"]

#: The state dicts, in the order ``benchmarks checkpoint`` runs them.
STATE_DICTS = ("gpt2", "resnet50", "small", "small6k", "lora")


# ---------------------------------------------------------------- state dicts (checkpoint, dcp)


def _randn(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    import torch

    return torch.randn(shape, generator=g)


def gpt2_state_dict(layers: int = 12, vocab: int = 50257, d: int = 768, n_ctx: int = 1024,
                    seed: int = 0) -> StateDict:
    """A GPT-2-shaped state dict of random fp32 tensors (HF ``transformer.*`` names, Conv1D layout).

    The default is GPT-2 small: about 124M parameters (498 MB).

    Args:
        layers: transformer blocks. Default 12.
        vocab: token embedding rows. Default 50257.
        d: model width. Default 768.
        n_ctx: position embedding rows. Default 1024.
        seed: generator seed. Default 0.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    sd: StateDict = {"transformer.wte.weight": _randn((vocab, d), g),
                     "transformer.wpe.weight": _randn((n_ctx, d), g)}
    for i in range(layers):
        p = f"transformer.h.{i}."
        shapes = {
            "ln_1.weight": (d,), "ln_1.bias": (d,),
            "attn.c_attn.weight": (d, 3 * d), "attn.c_attn.bias": (3 * d,),
            "attn.c_proj.weight": (d, d), "attn.c_proj.bias": (d,),
            "ln_2.weight": (d,), "ln_2.bias": (d,),
            "mlp.c_fc.weight": (d, 4 * d), "mlp.c_fc.bias": (4 * d,),
            "mlp.c_proj.weight": (4 * d, d), "mlp.c_proj.bias": (d,),
        }
        for name, shape in shapes.items():
            sd[p + name] = _randn(shape, g)
    sd["transformer.ln_f.weight"] = _randn((d,), g)
    sd["transformer.ln_f.bias"] = _randn((d,), g)
    return sd


def resnet50_state_dict(width: int = 64, classes: int = 1000, seed: int = 0) -> StateDict:
    """A ResNet-50-shaped state dict (torchvision names), about 25.6M parameters at the defaults.

    Bottleneck blocks [3, 4, 6, 3], expansion 4; every BatchNorm has weight,
    bias, running_mean, running_var (fp32) and num_batches_tracked (int64, 0-d).

    Args:
        width: channels of the stem and the first stage. Default 64.
        classes: rows of the classifier. Default 1000.
        seed: generator seed. Default 0.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    sd: StateDict = {}

    def conv(name: str, c_out: int, c_in: int, k: int) -> None:
        sd[f"{name}.weight"] = _randn((c_out, c_in, k, k), g)

    def bn(name: str, c: int) -> None:
        sd[f"{name}.weight"] = _randn((c,), g)
        sd[f"{name}.bias"] = _randn((c,), g)
        sd[f"{name}.running_mean"] = _randn((c,), g)
        sd[f"{name}.running_var"] = _randn((c,), g).abs()
        sd[f"{name}.num_batches_tracked"] = torch.tensor(1000, dtype=torch.int64)

    conv("conv1", width, 3, 7)
    bn("bn1", width)
    c_in = width
    for stage, blocks in enumerate((3, 4, 6, 3)):
        planes = width * 2**stage
        for b in range(blocks):
            p = f"layer{stage + 1}.{b}"
            conv(f"{p}.conv1", planes, c_in, 1)
            bn(f"{p}.bn1", planes)
            conv(f"{p}.conv2", planes, planes, 3)
            bn(f"{p}.bn2", planes)
            conv(f"{p}.conv3", planes * 4, planes, 1)
            bn(f"{p}.bn3", planes * 4)
            if b == 0:
                conv(f"{p}.downsample.0", planes * 4, c_in, 1)
                bn(f"{p}.downsample.1", planes * 4)
            c_in = planes * 4
    sd["fc.weight"] = _randn((classes, c_in), g)
    sd["fc.bias"] = _randn((classes,), g)
    return sd


def small_state_dict(count: int = 10_000, lo: int = 4 << 10, hi: int = 64 << 10, seed: int = 0) -> StateDict:
    """``count`` fp32 tensors of uniformly random sizes between ``lo`` and ``hi`` bytes (multiples of 4).

    Args:
        count: tensors. Default 10,000.
        lo: smallest size in bytes. Default 4 KiB.
        hi: largest size in bytes. Default 64 KiB.
        seed: generator seed. Default 0.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(lo // 4, hi // 4 + 1, (count,), generator=g).tolist()
    return {f"t{i:05d}": _randn((n,), g) for i, n in enumerate(sizes)}


#: The linear layers of a Llama decoder layer: (module path, input features, output features) at d=4096.
_LLAMA_LINEARS = (("self_attn.q_proj", 4096, 4096), ("self_attn.k_proj", 4096, 4096),
                  ("self_attn.v_proj", 4096, 4096), ("self_attn.o_proj", 4096, 4096),
                  ("mlp.gate_proj", 4096, 11008), ("mlp.up_proj", 4096, 11008), ("mlp.down_proj", 11008, 4096))


def lora_state_dict(layers: int = 32, rank: int = 8, seed: int = 0) -> StateDict:
    """A LoRA adapter's state dict, as PEFT saves one for a Llama-7B-shaped model: ``lora_A``
    (rank x in) and ``lora_B`` (out x rank) of every linear layer of every decoder layer, fp16.

    The default (32 layers, rank 8) has 448 tensors of 64 to 172 KiB, 39 MB.

    Args:
        layers: decoder layers. Default 32.
        rank: the adapters' rank. Default 8.
        seed: generator seed. Default 0.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    sd: StateDict = {}
    for i in range(layers):
        for module, n_in, n_out in _LLAMA_LINEARS:
            p = f"base_model.model.model.layers.{i}.{module}"
            sd[f"{p}.lora_A.weight"] = _randn((rank, n_in), g).half()
            sd[f"{p}.lora_B.weight"] = _randn((n_out, rank), g).half()
    return sd


@dataclass
class StateDictWorkload:
    """A named state dict to save and load."""

    name: str
    state: StateDict

    @property
    def nbytes(self) -> int:
        """Tensor payload in bytes."""
        return sum(t.numel() * t.element_size() for t in self.state.values())

    @property
    def params(self) -> int:
        """Elements in all tensors."""
        return sum(t.numel() for t in self.state.values())


def build_state_dicts(names: tuple[str, ...] | list[str] = STATE_DICTS,
                      quick: bool = False) -> list[StateDictWorkload]:
    """Build the named workloads; ``quick`` shrinks GPT-2 to 4 layers and vocab 8192, the small
    dicts to 1,000 and 600 tensors, the LoRA adapter to 4 layers.

    Raises:
        ValueError: on an unknown name.
    """
    out = []
    for name in names:
        if name == "gpt2":
            sd = gpt2_state_dict(4, 8192) if quick else gpt2_state_dict()
        elif name == "resnet50":
            sd = resnet50_state_dict()
        elif name == "small":
            sd = small_state_dict(1_000 if quick else 10_000)
        elif name == "small6k":
            sd = small_state_dict(600 if quick else 6_000, seed=1)
        elif name == "lora":
            sd = lora_state_dict(4 if quick else 32)
        else:
            raise ValueError(f"unknown workload {name!r}: expected some of {', '.join(STATE_DICTS)}")
        out.append(StateDictWorkload(name, sd))
    return out


# ---------------------------------------------------------------- classifiers to train (offload, plan --runtime, data)


def deep_mlp(d: int = 1024, depth: int = 8) -> nn.Module:
    """An MLP of ``depth`` Linear+ReLU layers of width ``d`` and a 10-way head."""
    from torch import nn

    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(d, d), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(d, 10))


def conv_net(channels: int = 32, blocks: int = 6) -> nn.Module:
    """A CNN of ``blocks`` conv+BN+ReLU blocks at 32x32, max-pooled, and a 10-way head."""
    from torch import nn

    layers: list[nn.Module] = []
    c_in = 3
    for _ in range(blocks):
        layers += [nn.Conv2d(c_in, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU()]
        c_in = channels
    return nn.Sequential(*layers, nn.MaxPool2d(4), nn.Flatten(), nn.Linear(channels * 64, 10))


def small_cnn(classes: int = 10) -> nn.Module:
    """A small CNN for 32x32 RGB images: two conv+ReLU+max-pool stages (16, 32 channels) and a
    64-wide head (``benchmarks data --convergence`` trains it through each loader)."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, classes),
    )


@dataclass
class TrainWorkload:
    """A classifier, its inputs' shape, and how to make a batch of them (10 classes)."""

    name: str
    model: nn.Module
    sample: tuple[int, ...]  # one example's shape
    device: str = "cpu"

    def batch(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        g = torch.Generator().manual_seed(n)
        x, y = torch.randn((n, *self.sample), generator=g), torch.randint(0, 10, (n,), generator=g)
        return x.to(self.device), y.to(self.device)


def train_workloads(quick: bool, device: str = "cpu") -> list[tuple[TrainWorkload, int]]:
    """The models (on ``device``) and their batch sizes."""
    import torch

    torch.manual_seed(0)
    if quick:
        return [(TrainWorkload("mlp", deep_mlp(512, 6).to(device), (512,), device), 256),
                (TrainWorkload("cnn", conv_net(16, 4).to(device), (3, 32, 32), device), 32)]
    return [(TrainWorkload("mlp", deep_mlp(1024, 8).to(device), (1024,), device), 1024),
            (TrainWorkload("cnn", conv_net(32, 6).to(device), (3, 32, 32), device), 64)]


# ---------------------------------------------------------------- models to record traces from (plan, trace)


#: The models traces are recorded from, by name.
MODEL_NAMES = ("bert", "vit", "resnet")


@dataclass(frozen=True)
class TraceWorkload:
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
              vocab: int = 1000, classes: int = 2) -> TraceWorkload:
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
    return TraceWorkload(Bert(), (x, y), _classify)


def vit_like(batch: int, *, layers: int = 2, width: int = 64, heads: int = 4, image: int = 32,
             patch: int = 4, classes: int = 10) -> TraceWorkload:
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
    return TraceWorkload(ViT(), (x, y), _classify)


def resnet_like(batch: int, *, layers: int = 2, width: int = 16, image: int = 32,
                classes: int = 10) -> TraceWorkload:
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
    return TraceWorkload(model, (x, y), _classify)


_BUILDERS: dict[str, Callable[..., TraceWorkload]] = {"bert": bert_like, "vit": vit_like, "resnet": resnet_like}


def build(name: str, batch: int, **size: Any) -> TraceWorkload:
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
    from pyfastensor.plan import record_trace

    w = build(name, batch, **size)
    return record_trace(w.model, w.batch, w.loss_fn)
