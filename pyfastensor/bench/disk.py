"""What every benchmark measures against: the disk's own limit, cold caches, timed passes.

The disk's limit is its sequential O_DIRECT bandwidth, measured in the same
run as the figures it is compared with: by fio when it is installed (the
reference tool, with a deep queue), else by the best of our own engines at
64 MiB blocks (and the report says which one). A limit measured on another
day, or copied from a datasheet, would hide whatever else the machine is
doing meanwhile.

Cold reads need the file's pages out of the page cache. As root,
:func:`drop_caches` syncs and writes ``3`` to ``/proc/sys/vm/drop_caches``
(every clean page of the machine goes); otherwise it asks the kernel to
drop the given files' pages with ``posix_fadvise(POSIX_FADV_DONTNEED)``,
which needs them clean, so it fsyncs them first.

:func:`timed_pass` is the one measuring loop: a whole file moved block by
block at successive offsets through one :class:`~pyfastensor.engines.EngineFile`,
so per-call overhead is part of the figure, writes ending in fsync.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engines import EngineFile

MiB = 1 << 20
GiB = 1 << 30

#: Block size of the engine fallback limit.
ENGINE_LIMIT_BLOCK = 64 * MiB

# fio jobs for the limit: large sequential O_DIRECT transfers with 256 MiB in
# flight, enough for a virtio or NVMe queue to reach its bandwidth.
# A limit size below bs shrinks bs to it.
FIO_WRITE = {"bs": 64 * MiB, "iodepth": 4}
FIO_READ = {"bs": 16 * MiB, "iodepth": 16}

_DROP_CACHES = "/proc/sys/vm/drop_caches"
_drop_caches_failed = ""  # set once writing drop_caches failed: fadvise from then on


def aligned_buffer(nbytes: int, align: int = 4096) -> np.ndarray:
    """Return an uninitialised uint8 array of ``nbytes`` whose address is a multiple of ``align``.

    Over-allocates by ``align`` and slices at the first aligned address, so
    the direct engines can move it without a bounce buffer.

    Args:
        nbytes: length in bytes.
        align: address alignment, a power of two. Default 4096.
    """
    raw = np.empty(nbytes + align, dtype=np.uint8)
    shift = (-raw.ctypes.data) % align
    return raw[shift : shift + nbytes]


def fill_random(buf: np.ndarray, seed: int = 0) -> None:
    """Fill ``buf`` with pseudo-random bytes, so no layer can compress or skip zeros.

    Args:
        buf: a uint8 array.
        seed: generator seed. Default 0.
    """
    rng = np.random.default_rng(seed)
    step = 64 * MiB
    for lo in range(0, buf.nbytes, step):
        chunk = buf[lo : lo + step]
        chunk[:] = np.frombuffer(rng.bytes(chunk.nbytes), dtype=np.uint8)


def can_drop_caches() -> bool:
    """Whether :func:`drop_caches` can drop the whole page cache (root with a writable ``drop_caches``)."""
    return not _drop_caches_failed and os.geteuid() == 0 and os.access(_DROP_CACHES, os.W_OK)


def cold_cache_method() -> str:
    """Describe, in words, how :func:`drop_caches` will make reads cold here."""
    if can_drop_caches():
        return "sync; echo 3 > /proc/sys/vm/drop_caches before each cold read (root)"
    why = _drop_caches_failed or "not root"
    return (f"posix_fadvise(POSIX_FADV_DONTNEED) on the file before each cold read ({why}; "
            "run as root for a full drop)")


def drop_caches(paths: Iterable[str | os.PathLike[str]] = ()) -> str:
    """Drop cached pages so the next read of ``paths`` comes from the disk.

    As root: ``sync`` then ``echo 3 > /proc/sys/vm/drop_caches`` (all clean
    pages, dentries and inodes of the machine). Otherwise, or if that write
    fails: fsync each of ``paths`` and ``posix_fadvise(POSIX_FADV_DONTNEED)``
    it, which drops only those files' pages.

    Args:
        paths: the files about to be read cold (used by the fadvise method).

    Returns:
        ``"drop_caches"`` or ``"fadvise"``: the method used.
    """
    global _drop_caches_failed
    if can_drop_caches():
        os.sync()
        try:
            with open(_DROP_CACHES, "w") as f:
                f.write("3\n")
            return "drop_caches"
        except OSError as e:
            _drop_caches_failed = f"writing {_DROP_CACHES} failed: {e.strerror}"
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "fadvise"


def cache_files(paths: Iterable[str | os.PathLike[str]]) -> None:
    """Read every byte of ``paths`` once, so that they sit in the page cache (a warm-cache start)."""
    buf = bytearray(8 << 20)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def prime_memory(nbytes: int) -> None:
    """Fault in ``nbytes`` of anonymous memory once and give it back.

    On a virtual machine, the first touch of guest memory the process has
    never used costs the hypervisor's fault on top of the kernel's
    (measured on the development VM: 0.7 GB/s the first time, 4.4 GB/s for
    the same amount again, even in another process). Whichever tool ran
    first would pay it; touching the memory the runs will need beforehand
    gives every tool the same start.

    The mapping is advised for huge pages: a guest with free page reporting
    (the development VM's kernel: "Free page reporting enabled") hands free
    2 MiB blocks back to the host two seconds after they are freed, and
    huge-page allocations (ours: page-aligned tensors, the whole-file area)
    take whole such blocks, which 4 KiB priming left cold. A warm GPT-2 load
    into huge pages took 42-55 ms, but 235-399 ms in one round in three,
    after 4 KiB priming; after huge-page priming one round in nine. The
    allocator's 4 KiB pages are carved from the same warmed blocks.
    """
    if nbytes <= 0:
        return
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    try:
        a = np.frombuffer(m, dtype=np.uint8)
        a[:: mmap.PAGESIZE] = 1
        del a
    finally:
        m.close()


@dataclass
class Pass:
    """One timed sequential pass over a file.

    Attributes:
        nbytes: bytes moved.
        seconds: wall time, fsync included for writes, open excluded.
        engine: the engine that served the transfers (differs from the one
            asked for after a fallback).
        fallback: why another engine served them, or "".
    """

    nbytes: int
    seconds: float
    engine: str
    fallback: str

    @property
    def mbps(self) -> float:
        """Bandwidth in MB/s (10^6 bytes per second)."""
        return self.nbytes / self.seconds / 1e6 if self.seconds > 0 else 0.0


def timed_pass(
    path: str | os.PathLike[str],
    buf: Any,
    *,
    engine: str,
    write: bool,
    block: int,
    total: int,
    max_seconds: float | None = None,
    threads: int | None = None,
    task_size: int | None = None,
    queue_depth: int | None = None,
) -> Pass:
    """Move a file block by block through one engine and time it.

    A write creates (or truncates) ``path`` and writes ``buf[:block]`` at
    offsets 0, block, 2*block, ... until ``total`` bytes (at least one
    block), then fsyncs: the figure is durable bandwidth. A read reads as
    many blocks into ``buf[:block]`` (at least one), as far as the file's
    whole blocks go.
    Every block is one call through the same
    :class:`~pyfastensor.engines.EngineFile`, so per-call overhead counts.

    Args:
        path: the file.
        buf: the memory to move, at least ``block`` bytes (an
            :func:`aligned_buffer`, or a CUDA tensor for cufile).
        engine: engine name.
        write: write (True) or read (False).
        block: bytes per call.
        total: bytes per pass; a write moves at least one block.
        max_seconds: stop issuing blocks once this much time has passed
            (small blocks on slow paths); None for no limit. Default None.
        threads, task_size, queue_depth: engine options (default: the
            ``PYFASTENSOR_*`` settings).

    Returns:
        A :class:`Pass`.
    """
    view = buf[:block]
    opts = {"threads": threads, "task_size": task_size, "queue_depth": queue_depth}
    with EngineFile(path, "w" if write else "r", engine=engine, **opts) as f:
        count = max(1, total // block)
        if not write:
            count = min(count, f.size() // block)
        deadline = None if max_seconds is None else time.perf_counter() + max_seconds
        done = 0
        start = time.perf_counter()
        for i in range(count):
            if write:
                f.write(view, i * block)
            else:
                f.read_into(view, i * block)
            done += block
            if deadline is not None and time.perf_counter() > deadline:
                break
        if write:
            f.sync()
        seconds = time.perf_counter() - start
        return Pass(done, seconds, f.engine, f.fallback)


@dataclass
class DiskLimit:
    """The disk's own sequential bandwidth, measured in this run.

    Attributes:
        write_mbps: O_DIRECT sequential write bandwidth, MB/s.
        read_mbps: O_DIRECT sequential read bandwidth, MB/s.
        source: ``"fio"`` or ``"engine:<name>"`` (the engine, or engines, whose
            best figure at 64 MiB blocks stands in when fio is missing).
        write_how: how the write figure was measured, in words.
        read_how: how the read figure was measured, in words.
        note: why fio was not used, or "".
    """

    write_mbps: float
    read_mbps: float
    source: str
    write_how: str
    read_how: str
    note: str = ""

    def describe(self) -> str:
        """One line: both figures and how they were measured."""
        line = (f"disk limit ({self.source}): write {self.write_mbps:.0f} MB/s [{self.write_how}], "
                f"read {self.read_mbps:.0f} MB/s [{self.read_how}]")
        return f"{line}; {self.note}" if self.note else line


def parse_fio_json(text: str, rw: str) -> float:
    """Return the bandwidth in bytes/s of direction ``rw`` from fio's ``--output-format=json``.

    The bandwidth of every job is summed (fio reports one entry per job
    without ``--group_reporting``). Lines fio prints before the JSON (warnings)
    are skipped.

    Args:
        text: fio's standard output.
        rw: ``"read"`` or ``"write"``.

    Raises:
        ValueError: when the text holds no fio JSON, a job failed, or no job
            moved bytes in direction ``rw``.
    """
    if rw not in ("read", "write"):
        raise ValueError(f"rw {rw!r}: expected 'read' or 'write'")
    start = text.find("{")
    if start < 0:
        raise ValueError("fio output holds no JSON (was --output-format=json given?)")
    try:
        doc = json.loads(text[start:])
    except json.JSONDecodeError as e:
        raise ValueError(f"fio output is not valid JSON: {e}") from None
    jobs = doc.get("jobs") or []
    if not jobs:
        raise ValueError("fio JSON has no jobs")
    total = 0
    for job in jobs:
        if job.get("error"):
            raise ValueError(f"fio job {job.get('jobname')!r} failed with error {job['error']}")
        total += int(job.get(rw, {}).get("bw_bytes", 0))
    if total <= 0:
        raise ValueError(f"fio JSON reports no {rw} bandwidth")
    return float(total)


def fio_path() -> str | None:
    """Return the path of fio, or None when it is not installed."""
    return shutil.which("fio")


def _fio_version(fio: str) -> str:
    try:
        out = subprocess.run([fio, "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "fio"
    except (OSError, subprocess.SubprocessError):
        return "fio"


def _fio_env() -> dict[str, str]:
    """fio's environment: glibc's malloc asked to back fio's buffers with transparent huge pages.

    Our buffers are numpy arrays, which numpy madvises for huge pages. With
    THP in ``madvise`` mode, fio's malloc'd buffers would otherwise be 4 KiB
    pages scattered in physical memory: a virtio disk (at most 254 segments
    per request) then gets requests of about 1 MiB and fio reports well below
    what the disk delivers (measured here: 1.2-2.5 GB/s instead of 3-3.7).
    Older glibc ignores the tunable.
    """
    env = dict(os.environ)
    tune = "glibc.malloc.hugetlb=1"
    old = env.get("GLIBC_TUNABLES")
    env["GLIBC_TUNABLES"] = f"{old}:{tune}" if old else tune
    return env


def _run_fio(fio: str, path: str, rw: str, size: int, bs: int, iodepth: int) -> float:
    bs = min(bs, size)  # fio refuses a file smaller than one block
    cmd = [
        fio, f"--name=limit-{rw}", f"--filename={path}", f"--rw={rw}", f"--bs={bs}",
        f"--iodepth={iodepth}", "--ioengine=libaio", "--direct=1", f"--size={size}",
        "--fallocate=none", "--end_fsync=1", "--output-format=json",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_fio_env())
    if out.returncode != 0:
        msg = (out.stderr or out.stdout).strip().splitlines()
        raise RuntimeError(f"fio exited with status {out.returncode}: {msg[-1] if msg else ''}")
    return parse_fio_json(out.stdout, rw)


def fio_limit(directory: str | os.PathLike[str], *, size: int = GiB, repeat: int = 1) -> DiskLimit:
    """Measure the disk's limit with fio: O_DIRECT sequential write, then read of the same file.

    Write: ``bs=64M iodepth=4``, read: ``bs=16M iodepth=16`` (256 MiB in
    flight each), libaio, fsync at the end, buffers in transparent huge
    pages as ours are (see ``_fio_env``). Every write makes a new
    ``size``-byte file without preallocation, as our engines' writes do.
    The file is removed afterwards.

    Args:
        directory: where to put the file (the filesystem under test).
        size: bytes per job. Default 1 GiB.
        repeat: runs of each job; the best counts. Default 1.

    Raises:
        RuntimeError: when fio is missing or fails.
    """
    fio = fio_path()
    if fio is None:
        raise RuntimeError("fio is not installed")
    path = os.path.join(os.fspath(directory), ".pyfastensor-fio-limit")
    w = r = 0.0
    try:
        for _ in range(max(1, repeat)):
            # A new file each time, as our writes make: overwriting the
            # blocks of an existing file skips ext4's allocation and ran
            # 1.7x faster here (5.7-6.6 GB/s against 3.5), which is not the
            # figure our engines are compared on.
            if os.path.exists(path):
                os.remove(path)
            w = max(w, _run_fio(fio, path, "write", size, **FIO_WRITE))
        for _ in range(max(1, repeat)):
            drop_caches([path])  # O_DIRECT skips the cache, but the file's pages may linger
            r = max(r, _run_fio(fio, path, "read", size, **FIO_READ))
    finally:
        if os.path.exists(path):
            os.remove(path)
    version = _fio_version(fio)
    mib = f"{size / MiB:g} MiB" + (f", best of {repeat}" if repeat > 1 else "")

    def how(job: dict[str, int]) -> str:
        bs = f"{min(job['bs'], size) / MiB:g}M"
        return (f"{version} libaio O_DIRECT, bs={bs} iodepth={job['iodepth']}, {mib}, "
                "THP buffers")

    return DiskLimit(
        write_mbps=w / 1e6,
        read_mbps=r / 1e6,
        source="fio",
        write_how=how(FIO_WRITE) + ", fsync",
        read_how=how(FIO_READ),
    )


def engine_limit(
    directory: str | os.PathLike[str],
    engines: Sequence[str],
    *,
    size: int = GiB,
    buf: np.ndarray | None = None,
    repeat: int = 1,
    note: str = "",
) -> DiskLimit:
    """Stand-in for fio: the best of ``engines`` at 64 MiB blocks, write (fsync) then cold read.

    Args:
        directory: where to put the file.
        engines: engines to try (those that can write: mmap is skipped).
        size: bytes per pass. Default 1 GiB.
        buf: an aligned buffer of at least 64 MiB to reuse; one is made if None.
        repeat: passes per engine and direction; the best counts. Default 1.
        note: why fio was not used, for the report.

    Raises:
        ValueError: when none of ``engines`` can write.
    """
    writers = [e for e in engines if e not in ("mmap", "cufile")]
    if not writers:
        raise ValueError(f"no engine among {', '.join(engines) or 'none'} can measure the limit")
    if buf is None or buf.nbytes < ENGINE_LIMIT_BLOCK:
        buf = aligned_buffer(ENGINE_LIMIT_BLOCK)
        fill_random(buf)
    path = os.path.join(os.fspath(directory), ".pyfastensor-engine-limit")
    best_w: tuple[float, str] = (0.0, "")
    best_r: tuple[float, str] = (0.0, "")
    try:
        for name in writers:
            for _ in range(max(1, repeat)):
                w = timed_pass(path, buf, engine=name, write=True, block=ENGINE_LIMIT_BLOCK,
                               total=size)
                drop_caches([path])
                r = timed_pass(path, buf, engine=name, write=False, block=ENGINE_LIMIT_BLOCK,
                               total=size)
                best_w = max(best_w, (w.mbps, w.engine))
                best_r = max(best_r, (r.mbps, r.engine))
    finally:
        if os.path.exists(path):
            os.remove(path)
    mib = f"{size / MiB:g} MiB" + (f", best of {repeat}" if repeat > 1 else "")
    return DiskLimit(
        write_mbps=best_w[0],
        read_mbps=best_r[0],
        source=f"engine:{best_w[1]}" + (f"/{best_r[1]}" if best_r[1] != best_w[1] else ""),
        write_how=f"best of {', '.join(writers)}: {best_w[1]}, 64 MiB blocks, {mib}, fsync",
        read_how=f"best of {', '.join(writers)}: {best_r[1]}, 64 MiB blocks, {mib}, cold",
        note=note,
    )


def measure_limit(
    directory: str | os.PathLike[str],
    *,
    engines: Sequence[str] = ("direct", "posix"),
    size: int = GiB,
    use_fio: bool = True,
    buf: np.ndarray | None = None,
    repeat: int = 1,
) -> DiskLimit:
    """Measure the disk's limit: fio when installed, else the best engine at 64 MiB blocks.

    Args:
        directory: a directory on the filesystem under test.
        engines: available engines for the fallback. Default direct, posix.
        size: bytes per direction. Default 1 GiB.
        use_fio: False skips fio even when it is installed. Default True.
        buf: an aligned buffer to reuse for the fallback.
        repeat: runs per direction; the best counts. Default 1.

    Returns:
        A :class:`DiskLimit`; its ``note`` says why fio was not used.

    Example::

        >>> from pyfastensor.bench import disk
        >>> print(disk.measure_limit(".", size=256 << 20).describe())  # doctest: +SKIP
        disk limit (fio): write 3320 MB/s [...], read 1500 MB/s [...]
    """
    if not use_fio:
        note = "fio not used (--no-fio)"
    elif fio_path() is None:
        note = "fio is not installed (apt install fio for the reference figure)"
    else:
        try:
            return fio_limit(directory, size=size, repeat=repeat)
        except (RuntimeError, ValueError, OSError) as e:
            note = f"fio failed ({e})"
    return engine_limit(directory, engines, size=size, buf=buf, repeat=repeat, note=note)
