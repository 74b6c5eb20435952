"""Cold loads of our files read the file whole (O_DIRECT) into a page arena whose pages become the tensors'."""

from __future__ import annotations

import ctypes
import gc
import importlib
import mmap
import os
import zipfile

import pytest
import torch
from checkpoint_helpers import assert_same, evict

import pyfastensor
from pyfastensor import CorruptFileError, _buffers, _lib
from pyfastensor._buffers import FREED, PageArena
from pyfastensor.checkpoint._native import Archive

load_mod = importlib.import_module("pyfastensor.checkpoint.load")
CARVE_MIN = _lib.settings()["carve_min"]


def state() -> dict:
    g = torch.Generator().manual_seed(5)
    return {"big": torch.randn(600_000, generator=g),  # 2.4 MB: its own pages
            "mid": torch.randn(CARVE_MIN // 4 + 3, generator=g),  # just over CARVE_MIN, not whole pages
            "small": torch.randn(100, generator=g),  # copied out
            "step": torch.tensor(7)}


def mapped() -> list[tuple[int, int]]:
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = line.split()[0].split("-")
            out.append((int(lo, 16), int(hi, 16)))
    return out


def mapped_within(lo: int, hi: int) -> list[tuple[int, int]]:
    return [(max(a, lo), min(b, hi)) for a, b in mapped() if a < hi and b > lo]


class _Unmaps:
    """libc as :mod:`pyfastensor._buffers` sees it, with every ``munmap`` it makes recorded."""

    def __init__(self, libc) -> None:
        self._libc = libc
        self.calls: list[tuple[int, int]] = []

    def munmap(self, addr: int, nbytes: int) -> int:
        self.calls.append((addr, addr + nbytes))
        return self._libc.munmap(addr, nbytes)

    def __getattr__(self, name: str):
        return getattr(self._libc, name)


@pytest.fixture
def unmaps(monkeypatch) -> _Unmaps:
    spy = _Unmaps(_buffers._libc)
    monkeypatch.setattr(_buffers, "_libc", spy)
    return spy


def left_mapped(unmaps: _Unmaps, lo: int, hi: int) -> list[tuple[int, int]]:
    """What of ``[lo, hi)`` pyfastensor has not unmapped once the runs kept for reuse are released
    (they are mapped only while kept: pyfastensor.empty_cache unmaps them). Read from the calls it
    made, not from /proc/self/maps: a range it unmapped may at once be mapped again by anyone."""
    kept = sorted((a, a + n) for a, n in FREED._order.items() if a < hi and a + n > lo)
    within = _merged(mapped_within(lo, hi))
    assert all(any(a <= k0 and k1 <= b for a, b in within) for k0, k1 in kept)
    pyfastensor.empty_cache()
    out = []
    at = lo
    for a, b in _merged(sorted((max(a, lo), min(b, hi)) for a, b in unmaps.calls if a < hi and b > lo)):
        if a > at:
            out.append((at, a))
        at = max(at, b)
    return out + ([(at, hi)] if at < hi else [])


@pytest.fixture
def arenas(monkeypatch, go_settings):
    """Every file is big enough to be read whole; yields the arenas the loads read into."""
    go_settings(whole_min=0, whole_average_min=0)
    seen: list[PageArena] = []
    adopt = PageArena.adopt

    def spy(addr, nbytes):
        seen.append(adopt(addr, nbytes))
        return seen[-1]

    monkeypatch.setattr(PageArena, "adopt", spy)
    return seen


def planned(path, **kw) -> dict:
    """How a load of ``path`` goes (Archive.load's plan); the arena of a whole read is released."""
    with Archive.load(os.fspath(path), **kw) as a:
        return a.plan


def resident(path) -> float:
    """The share of the file's pages in the page cache (mincore), read without parsing it."""
    size = os.path.getsize(path)
    page = mmap.PAGESIZE
    vec = (ctypes.c_ubyte * -(-size // page))()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        head = ctypes.c_char.from_buffer(m)
        try:
            assert ctypes.CDLL(None, use_errno=True).mincore(ctypes.c_void_p(ctypes.addressof(head)),
                                                             ctypes.c_size_t(size), vec) == 0
        finally:
            del head
    return sum(b & 1 for b in vec) / max(len(vec), 1)


def cold(path) -> bool:
    """Drop the file's cached pages; False where the filesystem keeps them (tmpfs) or O_DIRECT fails."""
    evict(path)
    return resident(path) < 0.5 and pyfastensor.info(os.path.dirname(path))["dir"]["o_direct"]


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "ck.pt"
    pyfastensor.save(state(), path)
    if not cold(path):
        pytest.skip("the temporary directory keeps its pages cached or refuses O_DIRECT")
    return path


def test_large_records_get_their_pages_and_the_rest_is_unmapped(saved, arenas, unmaps):
    got = pyfastensor.load(saved)
    assert_same(got, state())
    (arena,) = arenas
    lo, hi = arena.addr, arena.addr + arena.size
    page = os.sysconf("SC_PAGE_SIZE")
    runs = sorted((t.data_ptr(), t.data_ptr() + -(-t.untyped_storage().nbytes() // page) * page)
                  for t in (got["big"], got["mid"]))
    assert all(lo <= a < b <= hi and a % page == 0 for a, b in runs)
    # Only the two records' pages are still mapped; the small ones were copied out.
    assert mapped_within(lo, hi) == runs or _merged(mapped_within(lo, hi)) == _merged(runs)
    assert not lo <= got["small"].data_ptr() < hi and not lo <= got["step"].data_ptr() < hi
    # Each tensor owns its pages: freeing one keeps them for reuse (a run of 1 MiB and up),
    # then unmaps them, and leaves the other intact.
    big_run = (got["big"].data_ptr(), runs[[r[0] for r in runs].index(got["big"].data_ptr())][1])
    del got["big"]
    assert FREED._order.get(big_run[0]) == big_run[1] - big_run[0]
    assert not any(a < big_run[1] and b > big_run[0] for a, b in left_mapped(unmaps, lo, hi))
    assert torch.equal(got["mid"], state()["mid"])
    got["mid"].mul_(2)  # writable, private
    assert torch.equal(got["mid"], state()["mid"] * 2)
    del got
    assert left_mapped(unmaps, lo, hi) == []


def _merged(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(runs):
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def test_tensors_share_and_survive_as_torch_storages(saved, arenas):
    got = pyfastensor.load(saved)
    assert arenas
    big = got["big"]
    with pytest.raises(RuntimeError, match="not resizable"):
        big.untyped_storage().resize_(8)
    big.share_memory_()
    assert big.is_shared() and torch.equal(big, state()["big"])


@pytest.mark.parametrize("record,key", [("archive/data/0", "['big']"), ("archive/data/2", "['small']")])
def test_damaged_record_raises_and_unmaps_everything(saved, arenas, unmaps, record, key):
    from test_checkpoint_corrupt import data_span, flip

    start, size = data_span(saved, record)
    flip(saved, start + size // 2)
    assert cold(saved)
    with pytest.raises(CorruptFileError) as e:
        pyfastensor.load(saved)
    msg = str(e.value)
    assert str(saved) in msg and record in msg and key in msg and "CRC-32" in msg
    (arena,) = arenas
    del e
    gc.collect()  # the traceback's frames held the records' tensors
    assert left_mapped(unmaps, arena.addr, arena.addr + arena.size) == []


def test_damaged_local_header_is_caught_from_memory(saved, arenas):
    from test_checkpoint_corrupt import data_span, flip

    assert cold(saved)
    assert planned(saved)["whole"], "the intact file, cold, is read whole"
    arenas.clear()
    start, _ = data_span(saved, "archive/data/0")
    flip(saved, start - 4096 + 30 + 2)  # inside the name of data/0's local header (header, then padding)
    assert cold(saved)
    with pytest.raises(CorruptFileError, match=str(saved)):
        pyfastensor.load(saved)
    # The parse from memory failed inside the load's one native call, which unmapped the
    # memory it had read the file into: no arena reached Python.
    assert arenas == []


def test_whole_read_only_for_files_of_records_not_too_small(saved, go_settings):
    go_settings(whole_min=0)
    size = os.path.getsize(saved)
    n = len(zipfile.ZipFile(saved).namelist())
    for least, taken in ((0, True), (size // n, True), (size // n + 1, False)):
        go_settings(whole_average_min=least)
        evict(saved)
        with Archive.load(str(saved)) as archive:
            plan = archive.plan
            assert plan["whole"] == taken == archive.read_whole == (archive.arena is not None), (least, plan)
            if not taken:
                assert "average" in plan["reason"]


def test_whole_read_only_for_cold_files_of_ours(tmp_path, saved, arenas):
    pyfastensor.load(saved, mmap=True)
    pyfastensor.load(saved, engine="posix")
    assert arenas == []  # neither reads whole
    saved.read_bytes()  # now cached
    pyfastensor.load(saved)
    assert arenas == []
    theirs = tmp_path / "theirs.pt"
    torch.save(state(), theirs)
    cold(theirs)
    assert_same(pyfastensor.load(theirs), state())
    assert arenas == []


def test_arena_refuses_overlapping_and_unaligned_runs(unmaps):
    a = PageArena(1 << 20)
    page = os.sysconf("SC_PAGE_SIZE")
    t = a.take(page, 3 * page)
    for off, n in ((0, 2 * page), (3 * page, 10), (page // 2, 10), (a.size, 1)):
        with pytest.raises(ValueError, match="cannot hand out"):
            a.take(off, n)
    a.close()
    assert mapped_within(a.addr, a.addr + a.size) == [(t.data_ptr(), t.data_ptr() + 3 * page)]
    with pytest.raises(ValueError):
        a.take(8 * page, 10)
    del t
    assert left_mapped(unmaps, a.addr, a.addr + a.size) == []
