"""``ChunkSampler``: a rank's share of each epoch's permutation of a ``ChunkDataset``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.utils.data

if TYPE_CHECKING:
    from .dataset import ChunkDataset


class ChunkSampler(torch.utils.data.Sampler[int]):
    """This rank's share of each epoch's permutation of a :class:`ChunkDataset` (:meth:`ChunkDataset.sampler`).

    Rank ``r`` of ``w`` asks for ``perm[r::w]``, ``perm`` the epoch's permutation
    (seeded by ``seed + epoch``, the epoch the dataset's :meth:`~ChunkDataset.set_epoch`
    set). Each iteration tells a distributed dataset the positions it will ask
    for, in order: the owners of other ranks' slots prefetch along them. After
    :meth:`~ChunkDataset.load_state_dict` the first iteration of the state's epoch
    skips the requests made before the state was taken (a distributed state's
    ``issued``; one node's ``served``, its requests being served in order), so
    a ``DataLoader`` over it asks for exactly the rest of the epoch.
    """

    def __init__(self, dataset: ChunkDataset, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed

    def _order(self) -> tuple[int, list[int]]:
        ds = self.dataset
        n = len(ds)
        rank, world = ds._share()
        epoch = ds._epoch
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed((self.seed + epoch) % (1 << 63))
            perm = torch.randperm(n, generator=g)
        else:
            perm = torch.arange(n)
        return epoch, perm[rank::world].tolist()[ds._resume.get(epoch, 0):]

    def __len__(self) -> int:
        return len(self._order()[1])

    def __iter__(self) -> Iterator[int]:
        epoch, order = self._order()
        ds = self.dataset
        if ds._resume.pop(epoch, 0) and order:
            ds._resumed_at = (epoch, order[0])  # the first request must be this one (see ChunkDataset)
        if ds.distributed:
            ds._live().dist_sequence(epoch, order)
        return iter(order)
