"""Shared by the training-data tests: a small class-sorted dataset, and reading epochs."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import torch

CLASSES = ("ant", "bee", "cow")
PER_CLASS = 100
CHUNK = 16


def make_folder(root: Path, seed: int = 0) -> dict[bytes, tuple[str, int]]:
    """Write an ImageFolder of random files (16 to 1500 bytes) under ``root``; return
    each file's bytes -> (path relative to root, label)."""
    rng = random.Random(seed)
    files: dict[bytes, tuple[str, int]] = {}
    for label, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(PER_CLASS):
            data = rng.randbytes(rng.randint(16, 1500))
            rel = f"{name}/{i:03d}.bin"
            (root / rel).write_bytes(data)
            files[data] = (rel, label)
    return files


def keep(batch: list) -> list:
    """A collate_fn keeping the batch as a list (samples differ in length)."""
    return batch


def digest(t: torch.Tensor) -> str:
    return hashlib.sha1(t.numpy().tobytes()).hexdigest()


def serve(ds: torch.utils.data.Dataset, order: list[int], batch_size: int = 32) -> list[tuple[int, int, str]]:
    """Request ``order`` through a DataLoader (num_workers=0); return each delivered
    sample as (position, label, sha1 of its bytes). ``ds`` has ``with_index=True``."""
    dl = torch.utils.data.DataLoader(ds, batch_size=batch_size, sampler=order, collate_fn=keep)
    return [(int(i), int(label), digest(data)) for batch in dl for data, label, i in batch]


def native_mapped() -> bool:
    """Whether this process has pyfastensor's native library mapped."""
    with open("/proc/self/maps") as f:
        return any("pyfastensor/_native" in line for line in f)


def tag_process(data: torch.Tensor) -> tuple[torch.Tensor, int, bool]:
    """A transform recording which process served a sample and whether it mapped the library."""
    import os

    return data, os.getpid(), native_mapped()
