"""Training data in chunks (Brand): :func:`pack` a dataset's files, read it with :class:`ChunkDataset`.

A pack is a directory of chunk files (the samples, shuffled once and cut into
chunks of N) and an index. :class:`ChunkDataset` serves it to torch's
``DataLoader`` from a memory budget, reading whole chunks only, and delivers
every sample exactly once per epoch in an order that is a function of
(seed, epoch, request sequence); :func:`verify` re-checks every checksum.
The Go core (``loader/``) does the work; this package lists the files and
hands out tensors.

:func:`pack` and :func:`verify` do not import torch; :class:`ChunkDataset`
(which does) loads on first use. ``ChunkDataset(..., distributed=True)`` makes
the ranks of a torch.distributed job one cluster (Brand's distributed
protocol), read with :class:`ChunkSampler` (``dataset.sampler()``).
"""

from .pack import pack, verify

__all__ = ["ChunkDataset", "ChunkSampler", "pack", "verify"]


def __getattr__(name: str) -> object:
    if name in ("ChunkDataset", "ChunkSampler"):  # import torch: on first use, as pyfastensor's own lazy names
        from . import dataset

        return getattr(dataset, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
