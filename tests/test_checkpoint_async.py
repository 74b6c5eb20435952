"""pyfastensor.async_save: snapshot semantics, errors on result(), one save per target."""

from __future__ import annotations

import errno
import logging
import multiprocessing
import subprocess
import sys
import threading

import pytest
import torch
from checkpoint_helpers import assert_same, sharing

import pyfastensor
from pyfastensor.checkpoint import _in_flight


def test_snapshot_then_mutate(tmp_path):
    model = torch.nn.Linear(64, 64)
    sd = model.state_dict()
    sd["tied"] = sd["weight"]
    sd["view"] = sd["weight"][3:5]
    before = {k: v.clone() for k, v in sd.items()}
    fut = pyfastensor.async_save(sd, tmp_path / "x.pt")
    with torch.no_grad():
        model.weight.add_(1.0)  # the caller goes on training
        model.bias.zero_()
    assert fut.result(timeout=60) is None
    got = pyfastensor.load(tmp_path / "x.pt")
    for k in ("weight", "bias"):
        assert torch.equal(got[k], before[k])
    assert sharing(got) == sharing(sd)
    assert got["view"].storage_offset() == sd["view"].storage_offset()
    assert_same(torch.load(tmp_path / "x.pt"), got)


def test_a_missing_directory_is_refused_at_the_call(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no such directory {tmp_path / 'missing'}"):
        pyfastensor.async_save({"w": torch.ones(3)}, tmp_path / "missing" / "x.pt")


def test_errors_surface_on_result_and_in_the_log(tmp_path, caplog):
    target = tmp_path / "x.pt"
    target.mkdir()  # found by the write, in the background
    with caplog.at_level(logging.WARNING, logger="pyfastensor"):
        fut = pyfastensor.async_save({"w": torch.ones(3)}, target)
        with pytest.raises(OSError) as e:
            fut.result(timeout=60)
    assert e.value.errno == errno.EISDIR
    assert f"pyfastensor.async_save to {target} failed" in caplog.text


CHILD = r"""
import sys, torch, pyfastensor
target = sys.argv[1]
fut = pyfastensor.async_save({"w": torch.ones(3)}, target)  # fails; nobody asks
asked = pyfastensor.async_save({"w": torch.ones(3)}, target)
try:
    asked.result()
except OSError:
    print("asked", flush=True)
"""


def test_a_failure_nobody_asked_for_is_reported_at_exit(tmp_path):
    target = tmp_path / "x.pt"
    target.mkdir()
    r = subprocess.run([sys.executable, "-c", CHILD, str(target)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "asked\n", r.stderr
    at_exit = [line for line in r.stderr.splitlines() if "was never asked for" in line]
    assert len(at_exit) == 1 and str(target) in at_exit[0], r.stderr


def test_a_forked_child_is_told_not_left_waiting(tmp_path):
    """A child forked after the parent's saves has no thread of the parent's pool: its own save
    runs on its own, and fails at once (the library was loaded before the fork)."""
    pyfastensor.async_save({"w": torch.ones(3)}, tmp_path / "parent.pt").result(timeout=60)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()

    def child() -> None:
        try:
            pyfastensor.async_save({"w": torch.ones(3)}, tmp_path / "child.pt").result(timeout=30)
            q.put("saved")
        except BaseException as e:  # noqa: BLE001 - the test reads which
            q.put(type(e).__name__)

    p = ctx.Process(target=child)
    p.start()
    try:
        assert q.get(timeout=60) == "ForkedProcessError"
    finally:
        p.join(60)


def test_one_save_in_flight_per_target(tmp_path):
    futs = [pyfastensor.async_save({"i": i, "w": torch.full((200_000,), float(i))}, tmp_path / "x.pt")
            for i in range(5)]
    for f in futs:
        f.result(timeout=60)
    got = pyfastensor.load(tmp_path / "x.pt")
    assert got["i"] == 4 and torch.equal(got["w"], torch.full((200_000,), 4.0))


@pytest.fixture
def held_writes(monkeypatch):
    """async_save's background writes wait until the test sets the event it returns."""
    from pyfastensor.checkpoint._snapshot import Snapshot

    go = threading.Event()
    write = Snapshot.write

    def held(self):
        assert go.wait(60), "the test never let the write go"
        write(self)

    monkeypatch.setattr(Snapshot, "write", held)
    yield go
    go.set()


def test_at_most_two_saves_hold_a_snapshot(tmp_path, monkeypatch, held_writes):
    """A loop that saves faster than the disk writes: the third call waits for a write to end
    before copying the state, so at most two copies are held."""
    from pyfastensor.checkpoint import _snapshot

    async_save = sys.modules["pyfastensor.checkpoint.async_save"]  # the module, not the function
    alive, most = [0], [0]
    take, release = _snapshot.snapshot, _snapshot.Snapshot.release

    def counted_take(*a, **k):
        snap = take(*a, **k)
        alive[0] += 1
        most[0] = max(most[0], alive[0])
        return snap

    def counted_release(self):
        if not getattr(self, "counted_out", False):
            self.counted_out = True
            alive[0] -= 1
        release(self)

    waiting = threading.Event()  # a call has asked for a slot while two writes are held
    slot = _in_flight.slot

    def watched_slot() -> None:
        if alive[0] == 2:
            waiting.set()
        slot()

    monkeypatch.setattr(async_save, "snapshot", counted_take)
    monkeypatch.setattr(_snapshot.Snapshot, "release", counted_release)
    monkeypatch.setattr(_in_flight, "slot", watched_slot)
    state = {"w": torch.ones(1000)}
    futs = [pyfastensor.async_save(state, tmp_path / f"{i}.pt") for i in range(2)]
    third: list = []
    caller = threading.Thread(target=lambda: third.append(pyfastensor.async_save(state, tmp_path / "2.pt")))
    caller.start()
    assert waiting.wait(60), "the third call asked for no slot"
    assert most[0] == 2 and not third, "a third copy was taken before a slot"
    held_writes.set()
    caller.join(60)
    for f in futs + third:
        f.result(timeout=60)
    assert most[0] == 2 and alive[0] == 0
    for i in range(3):
        assert torch.equal(pyfastensor.load(tmp_path / f"{i}.pt")["w"], state["w"])


def test_a_save_after_an_async_save_to_the_same_path_is_the_one_left(tmp_path, monkeypatch, held_writes):
    target = tmp_path / "x.pt"
    fut = pyfastensor.async_save({"by": "async_save"}, target)
    errors: list = []
    entered, done_when_settled = threading.Event(), []
    settle = _in_flight.settle

    def watched_settle(key: str) -> None:
        entered.set()
        settle(key)
        done_when_settled.append(fut.done() or not _in_flight._by_target)

    monkeypatch.setattr(_in_flight, "settle", watched_settle)

    def later() -> None:
        try:
            pyfastensor.save({"by": "save"}, str(tmp_path / "." / "x.pt"))  # the same file, named otherwise
        except BaseException as e:  # noqa: BLE001 - the test reads it
            errors.append(e)

    caller = threading.Thread(target=later)
    caller.start()
    assert entered.wait(60), "the save did not ask for the async_save in flight to its path"
    held_writes.set()
    fut.result(timeout=60)
    caller.join(60)
    assert not errors and not caller.is_alive()
    assert done_when_settled == [True], "the save went on while the async_save was still writing"
    assert pyfastensor.load(target) == {"by": "save"}


def test_async_save_needs_a_path():
    import io

    with pytest.raises(TypeError, match="path"):
        pyfastensor.async_save({"w": torch.ones(1)}, io.BytesIO())


def test_a_snapshot_that_fails_to_release_still_gives_back_its_target_and_slot(tmp_path, monkeypatch):
    """Releasing the snapshot raises (a CUDA error while its copies are waited for): the future
    says so, and the target and the slot are given back, so later saves go on."""
    from pyfastensor.checkpoint._snapshot import Snapshot

    release = Snapshot.release

    def failing(self):
        release(self)
        if threading.current_thread().name.startswith("pyfastensor-save"):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(Snapshot, "release", failing)
    target = tmp_path / "x.pt"
    fut = pyfastensor.async_save({"w": torch.ones(3)}, target)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        fut.result(timeout=60)
    monkeypatch.setattr(Snapshot, "release", release)
    later = threading.Thread(target=pyfastensor.save, args=({"w": torch.zeros(3)}, target))
    later.start()
    later.join(60)
    assert not later.is_alive(), "a save to the target did not wait for a save that had ended"
    futs = [pyfastensor.async_save({"i": i}, tmp_path / f"{i}.pt") for i in range(3)]  # every slot free
    for f in futs:
        f.result(timeout=60)
    assert torch.equal(pyfastensor.load(target)["w"], torch.zeros(3))
