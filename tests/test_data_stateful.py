"""ChunkDataset under torchdata's StatefulDataLoader: exact mid-epoch resume.

A state taken after every batch of a small epoch, with 0 and 2 workers,
forked and spawned, loaded into a new StatefulDataLoader over a new
ChunkDataset in a new process, continues the epoch so that every sample is
delivered once across the interruption, each sample's bytes checked against
its source file; the next epoch follows. torch's DataLoader resumes at an
epoch's end; a worker killed between two states loses and repeats nothing
after resuming from the last one; states given to the wrong side are
refused, naming what to do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from data_helpers import CLASSES, PER_CLASS, digest, keep

from pyfastensor.data import ChunkDataset
from pyfastensor.errors import InvalidArgumentError

torchdata = pytest.importorskip("torchdata.stateful_dataloader")
StatefulDataLoader = torchdata.StatefulDataLoader

ROOT = Path(__file__).resolve().parents[1]
N = len(CLASSES) * PER_CLASS
BATCH = 48  # 7 batches, the last of 12
BATCHES = -(-N // BATCH)
EPOCH = 2


@pytest.fixture(scope="module")
def small(packed) -> int:
    """A budget giving several abstract chunks of several chunks each (as in test_data.py)."""
    with ChunkDataset(packed, memory_budget=1 << 30) as ds:
        return ds.layout["min_budget"] * 15


def _loader(ds: ChunkDataset, workers: int, context: str | None) -> StatefulDataLoader:
    return StatefulDataLoader(ds, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(3),
                              num_workers=workers, multiprocessing_context=context if workers else None,
                              collate_fn=keep)


def _samples(batch: list) -> list[tuple[int, int, str]]:
    return [(int(index), int(label), digest(data)) for data, label, index in batch]


def _check_epoch(samples: list, files: dict[bytes, tuple[str, int]], digests: dict[str, int]) -> None:
    """Every position once, each with its source file's bytes and label."""
    assert sorted(p for p, _, _ in samples) == list(range(N)), "not every sample once"
    for _, label, d in samples:
        assert d in digests and digests[d] == label


@pytest.fixture(scope="module")
def digests(source) -> dict[str, int]:
    return {digest(torch.frombuffer(bytearray(data), dtype=torch.uint8)): label
            for data, (_, label) in source[1].items()}


# The new process: for each state, a new ChunkDataset and loader (or, with
# "plain", torch's DataLoader after ChunkDataset.load_state_dict), the rest
# of the epoch; then, after the first, the next epoch.
CHILD = """
import json, sys
sys.path[:0] = [{root!r}, {tests!r}]
import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from data_helpers import digest, keep
from pyfastensor.data import ChunkDataset

def main():
    args = json.load(open(sys.argv[1]))
    states = torch.load(args["states"], weights_only=False)
    out = []
    for k, state in enumerate(states):
        ds = ChunkDataset(args["pack"], memory_budget=args["budget"], seed=12345, with_index=True)
        workers, context = args["workers"], args["context"]
        if args["plain"]:
            ds.load_state_dict(state)
            ds.set_epoch(ds._epoch + 1)
            dl = torch.utils.data.DataLoader(ds, batch_size=48, shuffle=True, num_workers=workers,
                                             multiprocessing_context=context, collate_fn=keep)
        else:
            dl = StatefulDataLoader(ds, batch_size=48, shuffle=True, generator=torch.Generator().manual_seed(3),
                                    num_workers=workers, multiprocessing_context=context if workers else None,
                                    collate_fn=keep)
            dl.load_state_dict(state)
        rest = [(int(i), int(label), digest(data)) for batch in dl for data, label, i in batch]
        entry = {{"rest": rest, "epoch": ds.stats()["epoch"], "seed": ds.state_dict()["seed"] if not workers else None}}
        if k == 0 and not args["plain"]:
            ds.set_epoch(ds.stats()["epoch"] + 1)
            entry["next"] = [(int(i), int(label), digest(data)) for batch in dl for data, label, i in batch]
        out.append(entry)
        del dl
        ds.close()
    print(json.dumps(out))

if __name__ == "__main__":
    main()
"""


def _resume(tmp_path: Path, packed: Path, budget: int, states: list, workers: int, context: str | None,
            plain: bool = False) -> list[dict]:
    """Load each state into a new loader over a new dataset in one new process; return what each read."""
    torch.save(states, tmp_path / "states.pt")
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"pack": str(packed), "budget": budget, "states": str(tmp_path / "states.pt"),
                                "workers": workers, "context": context, "plain": plain}))
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(root=str(ROOT), tests=str(ROOT / "tests")))
    out = subprocess.run([sys.executable, str(script), str(args)], capture_output=True, text=True, timeout=600,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-4000:]
    return [{key: ([tuple(x) for x in v] if isinstance(v, list) else v) for key, v in e.items()}
            for e in json.loads(out.stdout)]


@pytest.mark.parametrize(("workers", "context", "cuts"), [
    (0, None, range(BATCHES + 1)),
    (2, "fork", range(BATCHES + 1)),
    (2, "spawn", (1, 4, BATCHES)),  # a new loader of spawned workers takes seconds
])
def test_resume_after_every_batch(packed, small, source, digests, tmp_path, workers, context, cuts):
    """A state after batch k (k = 0: before the first), loaded into a new StatefulDataLoader over a
    new ChunkDataset in a new process, delivers exactly the epoch's other samples; the next epoch
    delivers every sample once."""
    ds = ChunkDataset(packed, memory_budget=small, seed=5, with_index=True)
    ds.set_epoch(EPOCH)
    dl = _loader(ds, workers, context)
    states, batches = [dl.state_dict()], []
    for batch in dl:
        batches.append(_samples(batch))
        states.append(dl.state_dict())
    assert len(batches) == BATCHES
    _check_epoch([s for b in batches for s in b], source[1], digests)
    if workers:
        part = states[3]["_snapshot"]["_worker_snapshots"]["worker_1"]["dataset_state"]
        assert part["kind"] == "worker" and part["worker"] == 1 and part["num_workers"] == 2
        assert part["epoch"] == EPOCH and part["seed"] == 5
    del dl
    ds.close()

    resumed = _resume(tmp_path, packed, small, [states[k] for k in cuts], workers, context)
    for k, child in zip(cuts, resumed, strict=True):
        before = [s for b in batches[:k] for s in b]
        assert len(child["rest"]) == N - len(before), f"after batch {k}"
        _check_epoch(before + child["rest"], source[1], digests)
        # The same batches as the uninterrupted loader's, in order: its workers' batches are
        # served in the loader's round robin, and a part holds the server's state after its batch.
        assert child["rest"] == [s for b in batches[k:] for s in b], f"after batch {k}"
        assert child["epoch"] == EPOCH
        if not workers:
            assert child["seed"] == 5, "the state's seed"
    _check_epoch(resumed[0]["next"], source[1], digests)


def test_plain_dataloader_resumes_at_an_epoch_end(packed, small, source, digests, tmp_path):
    """torch's DataLoader with workers: the main process's state_dict() at an epoch's end, loaded in a
    new process, starts the next epoch, which delivers every sample once."""
    ds = ChunkDataset(packed, memory_budget=small, seed=5, with_index=True)
    ds.set_epoch(EPOCH)
    dl = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2,
                                     multiprocessing_context="fork", collate_fn=keep)
    _check_epoch([s for batch in dl for s in _samples(batch)], source[1], digests)
    state = ds.state_dict()
    assert state["served"] == N and state["epoch"] == EPOCH
    del dl
    ds.close()
    (child,) = _resume(tmp_path, packed, small, [state], 2, "fork", plain=True)
    assert child["epoch"] == EPOCH + 1
    _check_epoch(child["rest"], source[1], digests)


def test_killed_worker_between_two_states(packed, small, source, digests):
    """A worker killed after a state: the loader fails; a new loader resumed from that state (the last
    one) delivers the epoch's other samples once, none lost, none twice."""
    ds = ChunkDataset(packed, memory_budget=small, seed=5, with_index=True)
    ds.set_epoch(EPOCH)
    dl = _loader(ds, 2, "fork")
    it = iter(dl)
    consumed = [s for _ in range(3) for s in _samples(next(it))]
    state = dl.state_dict()
    next(it)  # consumed after the state: trained on again after the resume, as the state says
    pid = it._workers[1].pid
    os.kill(pid, signal.SIGKILL)
    # torch's SIGCHLD handler reports the kill (a RuntimeError naming the pid) wherever the main
    # thread is when the signal comes: joining the worker here, or in next(), unless the worker was
    # reaped first; then next() fails, naming it, or while it fetches a batch the dead worker
    # shared (ConnectionError). Reaped, the worker's death is reported no later.
    with pytest.raises((RuntimeError, ConnectionError)) as failed:
        it._workers[1].join(30)
        for _ in range(BATCHES):  # the batches already fetched come first
            next(it)
    assert isinstance(failed.value, ConnectionError) or str(pid) in str(failed.value)
    # Unregister the workers' pids now: while they stay registered, torch's SIGCHLD
    # handler raises this kill again in whatever runs at the next child's exit.
    it._shutdown_workers()
    del it, dl

    dl = _loader(ds, 2, "fork")
    dl.load_state_dict(state)
    rest = [s for batch in dl for s in _samples(batch)]
    _check_epoch(consumed + rest, source[1], digests)
    assert ds.stats()["served"] == N
    del dl
    ds.close()


def test_states_given_to_the_wrong_side(packed, small):
    """A worker's part loaded into the main process, or a main process's state given to a worker,
    is refused naming what to load where."""
    ds = ChunkDataset(packed, memory_budget=small, seed=5, with_index=True, timeout=20)
    dl = _loader(ds, 2, "fork")
    it = iter(dl)
    next(it)
    state = dl.state_dict()
    del it, dl
    part = state["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    with pytest.raises(InvalidArgumentError, match="worker 0's part of a StatefulDataLoader's state, loaded into "
                                                   "the main process"):
        ds.load_state_dict(part)

    state["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"] = ds.state_dict()
    dl = _loader(ds, 2, "fork")
    dl.load_state_dict(state)
    with pytest.raises(InvalidArgumentError, match="DataLoader worker 0 was given a main process's state"):
        iter(dl)
    del dl
    ds.close()


def test_persistent_workers_resume_in_a_later_epoch(packed, small, source, digests):
    """Persistent workers start each epoch's part afresh: a state taken in the second epoch, before
    its first batch and after its second, resumes that epoch exactly."""
    ds = ChunkDataset(packed, memory_budget=small, seed=5, with_index=True)
    dl = StatefulDataLoader(ds, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(3),
                            num_workers=2, multiprocessing_context="fork", collate_fn=keep, persistent_workers=True)
    _check_epoch([s for batch in dl for s in _samples(batch)], source[1], digests)
    ds.set_epoch(1)
    it = iter(dl)
    states = [dl.state_dict()]
    consumed = [_samples(next(it)) for _ in range(2)]
    states.append(dl.state_dict())
    del it, dl
    for k, state in ((0, states[0]), (2, states[1])):
        again = StatefulDataLoader(ds, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(3),
                                   num_workers=2, multiprocessing_context="fork", collate_fn=keep)
        again.load_state_dict(state)
        rest = [s for batch in again for s in _samples(batch)]
        assert ds.stats()["epoch"] == 1
        _check_epoch([s for b in consumed[:k] for s in b] + rest, source[1], digests)
        del again
    ds.close()


def test_sparse_snapshots_resume_exactly(packed, small, source, digests):
    """A StatefulDataLoader that snapshots every 3 batches (snapshot_every_n_steps=3) resumes exactly
    after any batch: it restores the last snapshot and replays the batches since, which the server,
    restored to the snapshot's state, serves again as it did."""
    def loader() -> StatefulDataLoader:
        return StatefulDataLoader(ds, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(3),
                                  num_workers=2, multiprocessing_context="fork", collate_fn=keep,
                                  snapshot_every_n_steps=3)

    ds = ChunkDataset(packed, memory_budget=small, seed=5, with_index=True)
    ds.set_epoch(EPOCH)
    dl = loader()
    batches, states = [], []
    for batch in dl:
        batches.append(_samples(batch))
        states.append(dl.state_dict())
    del dl
    for k in (1, 2, 4, 5):
        again = loader()
        again.load_state_dict(states[k - 1])
        rest = [_samples(batch) for batch in again]
        assert rest == batches[k:], f"after batch {k}"
        _check_epoch([s for b in batches[:k] + rest for s in b], source[1], digests)
        del again
    ds.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_chunk_sampler_resumes_under_stateful_dataloader(packed, small, source, digests, workers):
    """A StatefulDataLoader over ds.sampler() resumes exactly: the loader skips the requests its
    state says were made, and the dataset's restored state does not make the sampler skip them
    again; the next epoch delivers every sample once."""
    def loader(ds: ChunkDataset) -> StatefulDataLoader:
        return StatefulDataLoader(ds, batch_size=BATCH, sampler=ds.sampler(), num_workers=workers,
                                  multiprocessing_context="fork" if workers else None, collate_fn=keep)

    ds = ChunkDataset(packed, memory_budget=small, seed=5, with_index=True)
    ds.set_epoch(EPOCH)
    dl = loader(ds)
    batches, states = [], []
    for batch in dl:
        batches.append(_samples(batch))
        states.append(dl.state_dict())
    del dl
    ds.close()
    for k in (1, 3):
        ds = ChunkDataset(packed, memory_budget=small, seed=5, with_index=True)
        ds.set_epoch(EPOCH)  # the sampler's first iteration comes before the loader restores the dataset
        again = loader(ds)
        again.load_state_dict(states[k - 1])
        rest = [_samples(batch) for batch in again]
        assert rest == batches[k:], f"after batch {k}"
        _check_epoch([s for b in batches[:k] + rest for s in b], source[1], digests)
        ds.set_epoch(EPOCH + 1)
        _check_epoch([s for batch in again for s in _samples(batch)], source[1], digests)
        del again
        ds.close()


def test_a_loader_that_skips_what_the_sampler_skipped_is_refused(packed, small):
    """torchdata fast-forwards a batch_sampler it cannot restore (torch's BatchSampler) after the
    dataset's state made ds.sampler() skip the requests already made: they would be skipped twice
    and their samples lost to the epoch. The first request says so, and serves nothing."""
    def loader(ds: ChunkDataset) -> StatefulDataLoader:
        batches = torch.utils.data.BatchSampler(ds.sampler(), BATCH, drop_last=False)
        return StatefulDataLoader(ds, batch_sampler=batches, collate_fn=keep)

    ds = ChunkDataset(packed, memory_budget=small, seed=5, with_index=True)
    ds.set_epoch(EPOCH)
    dl = loader(ds)
    it = iter(dl)
    for _ in range(3):
        next(it)
    state = dl.state_dict()
    del it, dl
    ds.close()
    ds = ChunkDataset(packed, memory_budget=small, seed=5, with_index=True)
    again = loader(ds)
    again.load_state_dict(state)
    with pytest.raises(InvalidArgumentError, match="the loader skipped requests the sampler had skipped already"):
        next(iter(again))
    assert ds.stats()["served"] == 3 * BATCH, "nothing served past the state"
    ds.close()


def _slow_worker(worker: int):
    def transform(data: torch.Tensor) -> torch.Tensor:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.id == worker:
            time.sleep(0.002)  # this worker's requests reach the server late
        return data
    return transform


def test_same_seed_same_batches_with_workers(packed, small):
    """With 2 workers the batches are the same in two runs of the same seed, whichever worker is
    slower: the server serves the workers' batches in the loader's round robin."""
    runs = []
    for slow in (0, 1):
        ds = ChunkDataset(packed, memory_budget=small, seed=5, with_index=True, transform=_slow_worker(slow))
        ds.set_epoch(EPOCH)
        dl = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2,
                                         generator=torch.Generator().manual_seed(3),
                                         multiprocessing_context="fork", collate_fn=keep)
        runs.append([[int(index) for _, _, index in batch] for batch in dl])
        del dl
        ds.close()
    assert sorted(p for b in runs[0] for p in b) == list(range(N))
    assert runs[0] == runs[1]
