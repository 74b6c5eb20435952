"""Freed load memory is kept for the next load (pyfastensor._buffers.FreedPages), within its limit."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch
from checkpoint_helpers import assert_same

import pyfastensor
from pyfastensor import _buffers
from pyfastensor._buffers import FREED, FreedPages, _map_pages

PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 1 << 20


def is_mapped(addr: int, n: int) -> bool:
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr and addr + n <= hi:
                return True
    return False


def state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(3 * MIB // 4, generator=g),  # 3 MiB
            "b": torch.randn(3 * MIB // 4, generator=g),
            "c": torch.randn(MIB // 2 + 5, generator=g),  # just over 2 MiB, not whole pages
            "small": torch.randn(100, generator=g)}


def cached(tmp_path, seed: int = 1, name: str = "ck.pt"):
    """A checkpoint of ``state(seed)`` whose pages are cached: its records of 1 MiB and up
    load into pages of their own."""
    path = tmp_path / name
    pyfastensor.save(state(seed), path)
    path.read_bytes()
    return path


def with_setting(monkeypatch, value: str) -> None:
    """``PYFASTENSOR_KEEP_FREED=value`` for a pool read afresh."""
    monkeypatch.setenv("PYFASTENSOR_KEEP_FREED", value)
    monkeypatch.setattr(_buffers, "FREED", FreedPages())


@pytest.fixture(autouse=True)
def released():
    pyfastensor.empty_cache()
    yield
    pyfastensor.empty_cache()


def test_next_load_reuses_the_pages_a_freed_load_left_and_fills_them(tmp_path):
    first, second = cached(tmp_path, 1, "1.pt"), cached(tmp_path, 2, "2.pt")  # same shapes, other values
    got = pyfastensor.load(first)
    assert_same(got, state(1))
    large = {got[k].data_ptr() for k in ("a", "b", "c")}
    assert all(p % PAGE == 0 for p in large)
    del got
    assert large <= set(FREED._order) and FREED.nbytes == 8 * MIB + PAGE
    again = pyfastensor.load(second)
    assert {again[k].data_ptr() for k in ("a", "b", "c")} == large  # the same pages, every byte rewritten
    assert_same(again, state(2))
    assert FREED.nbytes == 0


def test_runs_past_the_limit_unmap_the_oldest_first():
    kept = FreedPages(limit=5 * MIB)
    runs = [_map_pages(2 * MIB) for _ in range(3)]
    for r in runs:
        kept.give(r, 2 * MIB)
    assert kept.nbytes == 4 * MIB
    assert not is_mapped(runs[0], 2 * MIB) and is_mapped(runs[1], 2 * MIB) and is_mapped(runs[2], 2 * MIB)
    assert kept.take(2 * MIB) == runs[2]  # the most recent run of the length
    assert kept.take(3 * MIB) is None  # only exact lengths are reused
    assert kept.release() == 2 * MIB
    assert kept.nbytes == 0 and not is_mapped(runs[1], 2 * MIB)
    _buffers._libc.munmap(runs[2], 2 * MIB)


def test_small_runs_and_runs_over_the_limit_are_unmapped_at_once():
    kept = FreedPages(limit=2 * MIB)
    small, big = _map_pages(MIB - PAGE), _map_pages(4 * MIB)
    kept.give(small, MIB - PAGE)
    kept.give(big, 4 * MIB)
    assert kept.nbytes == 0 and not is_mapped(small, MIB - PAGE) and not is_mapped(big, 4 * MIB)


def test_a_free_never_waits_for_the_lock():
    kept = FreedPages(limit=8 * MIB)
    run = _map_pages(2 * MIB)
    kept._lock.acquire()  # another thread is taking or giving
    done = threading.Event()
    t = threading.Thread(target=lambda: (kept.give(run, 2 * MIB), done.set()))
    t.start()
    assert done.wait(5), "give() waited for the lock"
    kept._lock.release()
    t.join()
    assert kept.nbytes == 0 and not is_mapped(run, 2 * MIB)


def test_keep_freed_zero_keeps_nothing(monkeypatch, tmp_path):
    with_setting(monkeypatch, "0")
    got = pyfastensor.load(cached(tmp_path))
    a = got["a"].data_ptr()
    del got
    assert _buffers.FREED.nbytes == 0 and not is_mapped(a, 3 * MIB)


def test_malformed_keep_freed_names_the_setting(monkeypatch, tmp_path):
    with_setting(monkeypatch, "lots")
    with pytest.raises(ValueError, match="PYFASTENSOR_KEEP_FREED"):
        pyfastensor.load(cached(tmp_path))


def test_empty_cache_unmaps_and_counts_what_it_released(tmp_path):
    path = cached(tmp_path)
    pyfastensor.empty_cache()  # what the save kept (bounce buffers)
    got = pyfastensor.load(path)
    a = got["a"].data_ptr()
    del got
    assert is_mapped(a, 3 * MIB)
    assert pyfastensor.empty_cache() == 8 * MIB + PAGE
    assert not is_mapped(a, 3 * MIB) and pyfastensor.empty_cache() == 0


def test_a_load_that_maps_new_memory_gives_back_as_much_kept(tmp_path):
    """A process whose loads never reuse what is kept (cold loads read into a new arena)
    keeps what its last load freed, not up to the limit."""
    path = cached(tmp_path)
    got = pyfastensor.load(path)
    old = {got[k].data_ptr() for k in ("a", "b", "c")}
    del got
    assert FREED.nbytes == 8 * MIB + PAGE
    arena = _buffers.PageArena(8 * MIB)  # what a cold load maps: no kept run has its length
    assert FREED.nbytes == 0 and not FREED._order
    # unmapped, unless the kernel placed the arena where they were
    assert all(not is_mapped(a, MIB) or arena.addr <= a < arena.addr + arena.size for a in old)
    arena.close()


def test_trim_unmaps_the_oldest_runs_first():
    kept = FreedPages(limit=16 * MIB)
    runs = [_map_pages(2 * MIB) for _ in range(3)]
    for r in runs:
        kept.give(r, 2 * MIB)
    kept.trim(3 * MIB)  # two runs cover it
    assert kept.nbytes == 2 * MIB and not is_mapped(runs[0], 2 * MIB) and not is_mapped(runs[1], 2 * MIB)
    assert kept.take(2 * MIB) == runs[2]
    _buffers._libc.munmap(runs[2], 2 * MIB)


def test_empty_cache_releases_the_bounce_buffers_of_unaligned_direct_writes(tmp_path):
    """An O_DIRECT write from unaligned memory goes through a bounce buffer the core keeps for
    the next one; empty_cache() unmaps it and counts it."""
    from pyfastensor.engines import EngineFile

    pyfastensor.empty_cache()
    data = np.frombuffer(np.random.default_rng(0).bytes(4 * MIB + 1), dtype=np.uint8)[1:]  # not page-aligned
    with EngineFile(tmp_path / "f", "w", engine="direct") as f:
        if f.engine != "direct":
            pytest.skip(f"no O_DIRECT on {tmp_path}: {f.fallback}")
        assert f.write(data, 0) == data.nbytes
    released = pyfastensor.empty_cache()
    assert released >= 2 * MIB, "at least one 2 MiB bounce buffer"
    assert released % (2 * MIB) == 0, "whole huge pages"
    assert pyfastensor.empty_cache() == 0
    assert (tmp_path / "f").read_bytes() == data.tobytes()
