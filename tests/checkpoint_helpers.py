"""Shared helpers of the checkpoint tests: comparing loaded objects with torch's, evicting files."""

from __future__ import annotations

import os
from typing import Any

import torch


def evict(path: Any) -> None:
    """Write back and drop the file's pages from the page cache (filesystems like tmpfs keep them)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The tensor's values as bytes (bitwise: NaNs and float8 compare exactly)."""
    return t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """Assert that two loaded objects are identical, tensors bitwise and in layout."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype, path
        assert a.shape == b.shape, path
        assert a.stride() == b.stride(), path
        assert a.storage_offset() == b.storage_offset(), path
        assert a.requires_grad == b.requires_grad, path
        assert a.device == b.device, path
        assert a.untyped_storage().nbytes() == b.untyped_storage().nbytes(), path
        assert tensor_bytes(a) == tensor_bytes(b), path
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), path
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor in a nested structure, in order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors(v)]
    return []


def sharing(obj: Any) -> list[int]:
    """For each tensor, the index of the first tensor with the same storage (the aliasing pattern)."""
    ts = tensors(obj)
    ptrs = [t.untyped_storage().data_ptr() for t in ts]
    return [ptrs.index(p) if p else i for i, p in enumerate(ptrs)]


class Tiny(torch.nn.Module):
    """A small model with a tied weight and a buffer: the usual checkpoint's shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.block = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.register_buffer("steps", torch.tensor(7))


def training_state() -> dict:
    """A model's and its Adam optimizer's state after two steps, with plain values beside them."""
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(2):
        x = torch.randint(0, 50, (4, 5))
        model.head(model.norm(model.block(model.emb(x)))).sum().backward()
        opt.step()
        opt.zero_grad()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3, "note": "hi"}
