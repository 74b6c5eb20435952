"""ChunkDataset with DataLoader workers: clients of the main process's loader server.

Every epoch delivers every sample once across forked and spawned workers,
each sample's bytes checked against its source file; spawned workers never
map the native library; a worker killed holding a batch gives it back, so
the epoch still delivers every sample once; a worker with no server to
reach says so.
"""

from __future__ import annotations

import multiprocessing
import os
import signal

import pytest
import torch
from data_helpers import CLASSES, PER_CLASS, keep, serve, tag_process

from pyfastensor._torch import new_shared_storage
from pyfastensor.data import ChunkDataset, _client
from pyfastensor.errors import ServerUnavailableError, UnsupportedError

N = len(CLASSES) * PER_CLASS




def _epoch(dl: torch.utils.data.DataLoader, files: dict[bytes, tuple[str, int]]) -> tuple[list[int], set[int], set[bool]]:
    """Read one epoch; check every sample's bytes and label; return positions, worker pids, native-mapped flags."""
    positions, pids, mapped = [], set(), set()
    for batch in dl:
        for (data, pid, has_native), label, index in batch:
            rel, want = files[data.numpy().tobytes()]
            assert label == want, rel
            positions.append(int(index))
            pids.add(pid)
            mapped.add(has_native)
    return positions, pids, mapped


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_deliver_every_sample_once(packed, source, context):
    files = source[1]
    ds = ChunkDataset(packed, memory_budget=1 << 20, with_index=True, transform=tag_process)
    g = torch.Generator().manual_seed(3)
    # shuffle=True: torch's RandomSampler calls len(ds) here, in the main
    # process, which opens its server before any worker asks.
    dl = torch.utils.data.DataLoader(ds, batch_size=16, shuffle=True, generator=g, num_workers=2,
                                     multiprocessing_context=context, collate_fn=keep, persistent_workers=True)
    orders = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        positions, pids, mapped = _epoch(dl, files)
        assert sorted(positions) == list(range(N)), f"epoch {epoch}: not every sample once"
        assert len(pids) == 2 and os.getpid() not in pids, "served in both workers, not the main process"
        if context == "spawn":
            assert mapped == {False}, "a spawned worker mapped the native library"
        st = ds.stats()
        assert st["served"] == N and st["returned"] == 0 and st["held_bytes"] == 0
        orders.append(positions)
    assert orders[0] != orders[1]
    del dl
    ds.close()


def test_worker_views_share_one_storage(packed):
    """A worker's batch crosses as views of one shared storage: one copy per byte, by the server."""
    ds = ChunkDataset(packed, memory_budget=1 << 20)
    assert len(ds) == N
    dl = torch.utils.data.DataLoader(ds, batch_size=8, sampler=list(range(8)), num_workers=1, collate_fn=keep)
    (batch,) = [b for b in dl]
    storages = {data.untyped_storage().data_ptr() for data, _ in batch}
    assert len(storages) == 1 and all(data.untyped_storage().is_shared() for data, _ in batch)
    # The storage is the batch's, with up to an eighth more room (and a page).
    total = sum(data.numel() for data, _ in batch)
    assert total <= batch[0][0].untyped_storage().nbytes() <= total + total // 8 + 4096
    ds.close()


def _storage_inode(data: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    fd, _ = data.untyped_storage()._share_fd_cpu_()
    return data.clone(), os.getpid(), os.fstat(fd).st_ino


def _copy_out(batch):
    return [(data, pid, ino, label) for (data, pid, ino), label in batch]


@pytest.mark.skipif(torch.multiprocessing.get_sharing_strategy() != "file_descriptor",
                    reason="the test names a storage by its file descriptor's inode")
def test_worker_reuses_its_batch_storage_once_free(packed, source):
    """A collate that copies the samples frees the batch's storage: the worker's next batches reuse it."""
    files = source[1]
    ds = ChunkDataset(packed, memory_budget=1 << 20, transform=_storage_inode)
    dl = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(4),
                                     num_workers=2, collate_fn=_copy_out)
    inodes: dict[int, set[int]] = {}
    seen, batches = [], 0
    for batch in dl:
        batches += 1
        for data, pid, ino, label in batch:
            rel, want = files[data.numpy().tobytes()]
            assert label == want, rel
            seen.append(rel)
            inodes.setdefault(pid, set()).add(ino)
    assert sorted(seen) == sorted(rel for rel, _ in files.values())
    assert batches >= 8
    for pid, used in inodes.items():
        assert len(used) <= _client.BatchBuffers.SIZE, f"worker {pid}: {len(used)} storages for its batches"
    ds.close()


def test_batch_buffers_reuse_only_what_nothing_holds():
    """A storage is reused once no tensor holds it, and never after torch pickled it for another process."""
    import io
    import pickle
    from multiprocessing.reduction import ForkingPickler

    bufs = _client.BatchBuffers(size=2)
    a = bufs.get(1000)
    assert a.nbytes() >= 1000 and a.is_shared()
    assert bufs.get(1000)._cdata == a._cdata, "free: reused"
    view = torch.empty(0, dtype=torch.uint8).set_(a)[:10]
    b = bufs.get(1000)
    assert b._cdata != a._cdata, "held by a tensor: another"
    assert bufs.get(5000)._cdata not in (a._cdata, b._cdata), "too small: another"
    del view
    assert bufs.get(1000)._cdata in (a._cdata, b._cdata)

    bufs = _client.BatchBuffers(size=1)
    c = bufs.get(1000)
    sent = torch.empty(0, dtype=torch.uint8).set_(c)[:10]
    ForkingPickler(io.BytesIO(), pickle.HIGHEST_PROTOCOL).dump(sent)  # as a worker's result queue does
    del sent
    for _ in range(3):
        assert bufs.get(1000)._cdata != c._cdata, "sent to another process: never reused"


def test_main_process_methods_refused_in_a_worker(packed):
    ds = ChunkDataset(packed, memory_budget=1 << 20, transform=_stats_in_worker)
    assert len(ds) == N
    dl = torch.utils.data.DataLoader(ds, batch_size=4, sampler=[0], num_workers=1, collate_fn=keep)
    with pytest.raises(UnsupportedError, match="belongs to the main process, not DataLoader worker 0"):
        list(dl)
    ds.close()


def _stats_in_worker(data: torch.Tensor) -> torch.Tensor:
    torch.utils.data.get_worker_info().dataset.stats()
    return data


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_any_sampler(packed, context):
    """A sampler that never calls len(ds) (a list): the constructor opened the server."""
    ds = ChunkDataset(packed, memory_budget=1 << 20, with_index=True)
    order = list(range(N))[::-1]
    dl = torch.utils.data.DataLoader(ds, batch_size=8, sampler=order, num_workers=2,
                                     multiprocessing_context=context, collate_fn=keep)
    got = [int(i) for batch in dl for _, _, i in batch]
    assert sorted(got) == list(range(N))
    ds.close()


def test_worker_of_a_closed_dataset(packed, monkeypatch):
    monkeypatch.setattr(_client, "CONNECT_TIMEOUT_S", 0.3)  # spawned workers do not see this: fork
    ds = ChunkDataset(packed, memory_budget=1 << 20)
    closed = multiprocessing.get_context("fork").Event()  # the worker asks only once the server is gone
    dl = torch.utils.data.DataLoader(ds, batch_size=4, sampler=[0, 1], num_workers=1,
                                     multiprocessing_context="fork", collate_fn=keep,
                                     worker_init_fn=lambda _: closed.wait(60))
    it = iter(dl)  # workers forked while the server listens
    ds._server.close()  # the main process's server goes away under them
    closed.set()
    try:
        with pytest.raises(ServerUnavailableError) as e:
            next(it)
    finally:
        it._shutdown_workers()
    assert "no loader server answers at '@pyfastensor-loader-" in str(e.value)
    ds.close()


def _client_process(address: str, batches: list[list[int]], die: bool, conn) -> None:
    """A worker's protocol by hand: take each batch, or, with ``die``, get the first, hold it until
    told to go on, and be killed."""
    c = _client.Client(address, "test")
    got = []
    for idx in batches:
        meta, ticket, _ = c.get(idx)
        positions = meta[0::4]
        if die:
            conn.send(positions)
            conn.recv()  # holding the batch until the other worker has its share
            os.kill(os.getpid(), signal.SIGKILL)
        total = sum(meta[3::4])
        storage = new_shared_storage(max(total, 1))
        fd, _ = storage._share_fd_cpu_()
        c.take(ticket, len(idx), fd, storage.nbytes())
        got.extend(positions)
    conn.send(got)


def test_killed_worker_loses_and_repeats_nothing(packed):
    ds = ChunkDataset(packed, memory_budget=1 << 20, with_index=True)
    assert len(ds) == N
    order = list(range(N))
    import random

    random.Random(9).shuffle(order)
    dead_share, live_share = order[:N // 2], order[N // 2:]
    batches = lambda share: [share[k:k + 10] for k in range(0, len(share), 10)]  # noqa: E731
    ctx = multiprocessing.get_context("spawn")
    procs, pipes = [], []
    for share, die in ((dead_share, True), (live_share, False)):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_client_process, args=(ds._address(), batches(share), die, child))
        p.start()
        procs.append(p)
        pipes.append(parent)
    lost = pipes[0].recv()
    live = pipes[1].recv()  # the other worker completed its share while the batch was held
    pipes[0].send("die")  # given back only now: no live request can take its samples first
    for p in procs:
        p.join(30)
    assert procs[0].exitcode == -signal.SIGKILL and procs[1].exitcode == 0
    assert len(lost) == 10 and len(live) == len(live_share)

    # The dead worker's batch is given back when its connection closes; its
    # share asked again (as a resumed DataLoader would) delivers the rest.
    import time

    deadline = time.monotonic() + 10
    while ds.stats()["returned"] != 10 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ds.stats()["returned"] == 10
    again = serve(ds, dead_share)
    assert [p for p, _, _ in again[:10]] == lost, "the batch given back, to the same requests"
    assert sorted(live + [p for p, _, _ in again]) == list(range(N))
    ds.close()
