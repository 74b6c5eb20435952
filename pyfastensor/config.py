"""Every setting pyfastensor reads from the environment, in one place.

Each setting has a typed reader; a malformed value raises ``ValueError``
naming the variable and what it accepts.

=============================  ==========================================
``PYFASTENSOR_THREADS``        goroutines per transfer (default: CPUs)
``PYFASTENSOR_TASK_SIZE``      bytes per parallel piece, e.g. ``8M``
``PYFASTENSOR_QUEUE_DEPTH``    io_uring requests in flight (default 32)
``PYFASTENSOR_CUFILE_LIB``     path of libcufile to load
``PYFASTENSOR_PROGRESS``       ``0`` turns progress bars off
``PYFASTENSOR_CACHE_DIR``      where adaptive dictionaries are kept
``PYFASTENSOR_LIB``            path of the native library (development)
``PYFASTENSOR_DATA_HOST``      address a distributed ChunkDataset listens on
``PYFASTENSOR_PINNED_POOL``    bytes of pinned host memory for CUDA loads and saves (default 256M)
``PYFASTENSOR_OFFLOAD_PINNED``  pinned host memory one CUDA offload may hold (default: half of RAM)
``PYFASTENSOR_SNAPSHOT_POOL``  pinned bytes an ``async_save`` of CUDA tensors may hold (default: RAM/8)
``PYFASTENSOR_DCP_STAGING``    pinned bytes a DCP save or load stages device tensors through at once (default 1G)
``PYFASTENSOR_CUDA_LOAD``      ``auto``, ``cufile`` or ``pinned``: how loads reach CUDA
``PYFASTENSOR_KEEP_FREED``     bytes of freed load memory kept for the next load (default 1G)
=============================  ==========================================
"""

from __future__ import annotations

import os
import site
import sys
from pathlib import Path

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Parse a byte size such as ``4096``, ``64K``, ``8M``, ``1G`` (binary units).

    Raises:
        ValueError: when ``text`` is not such a size.
    """
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _UNITS else ""
    number = t[: len(t) - len(unit)]
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"{text!r} is not a size: use bytes or a number with K, M, G or T") from None
    if value < 0:
        raise ValueError(f"{text!r}: a size cannot be negative")
    return int(value)


def _env_int(name: str, default: int, *, minimum: int = 0, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    want = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected {want}") from None
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"{name}={raw!r}: expected {want}")
    return value


#: Bounds of the engine tunings, as the Go core checks them (gofastensor/options.go).
MAX_THREADS, MAX_QUEUE_DEPTH, MIN_TASK_SIZE = 1024, 4096, 4 << 10


def threads() -> int:
    """``PYFASTENSOR_THREADS``: goroutines per transfer; 0 means the library default."""
    return _env_int("PYFASTENSOR_THREADS", 0, maximum=MAX_THREADS)


def task_size() -> int:
    """``PYFASTENSOR_TASK_SIZE``: bytes per parallel piece; 0 means the default (8 MiB)."""
    raw = os.environ.get("PYFASTENSOR_TASK_SIZE")
    if not raw:
        return 0
    try:
        n = parse_size(raw)
    except ValueError as e:
        raise ValueError(f"PYFASTENSOR_TASK_SIZE: {e}") from None
    if 0 < n < MIN_TASK_SIZE:
        raise ValueError(f"PYFASTENSOR_TASK_SIZE={raw!r}: expected 0 (the default) or at least {MIN_TASK_SIZE} bytes")
    return n


def queue_depth() -> int:
    """``PYFASTENSOR_QUEUE_DEPTH``: io_uring requests in flight; 0 means the default (32)."""
    return _env_int("PYFASTENSOR_QUEUE_DEPTH", 0, maximum=MAX_QUEUE_DEPTH)


def progress_enabled() -> bool:
    """``PYFASTENSOR_PROGRESS``: ``0``/``false``/``off`` disables progress bars."""
    raw = os.environ.get("PYFASTENSOR_PROGRESS", "1").strip().lower()
    if raw in ("0", "false", "off", "no"):
        return False
    if raw in ("1", "true", "on", "yes", ""):
        return True
    raise ValueError(f"PYFASTENSOR_PROGRESS={raw!r}: expected 0 or 1")


def cache_dir() -> Path:
    """``PYFASTENSOR_CACHE_DIR``, else ``$XDG_CACHE_HOME/pyfastensor``, else ``~/.cache/pyfastensor``."""
    raw = os.environ.get("PYFASTENSOR_CACHE_DIR")
    if raw:
        return Path(raw)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pyfastensor"


def data_host() -> str | None:
    """``PYFASTENSOR_DATA_HOST``: the address this rank's distributed ``ChunkDataset`` server
    listens on and publishes, for a node where the store's host resolves to a loopback
    address (a hostname in /etc/hosts as 127.0.1.1); None: the interface that routes to it."""
    raw = os.environ.get("PYFASTENSOR_DATA_HOST", "").strip()
    if not raw:
        return None
    if any(c.isspace() for c in raw) or ":" in raw.strip("[]") and not raw.startswith("["):
        raise ValueError(f"PYFASTENSOR_DATA_HOST={raw!r}: expected a host address (an IPv6 one in brackets)")
    return raw


def cufile_candidates() -> list[str]:
    """The libcufile copies torch's CUDA wheels install, for the Go core to try.

    The one resolution of which libcufile to load is the Go core's
    (``gds.CuFileLibrary``): ``PYFASTENSOR_CUFILE_LIB``, else the first of
    these that exists, else the dynamic loader's ``libcufile.so.0``.
    ``pyfastensor.info()["dir"]`` reports the outcome.
    """
    roots = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
    found: list[str] = []
    for root in roots:
        for sub in ("nvidia/cu13/lib", "nvidia/cufile/lib", "nvidia/cu12/lib"):
            candidate = str(Path(root) / sub / "libcufile.so.0")
            if candidate not in found and os.path.exists(candidate):
                found.append(candidate)
    return found


#: Default size of the pinned host pool CUDA transfers stage through: 4 ring
#: slots of 64 MiB. Each native read or write of a checkpoint's ring moves one
#: slot or two, in parallel pieces of the task size (8 of them from 64 MiB), so
#: the device has several large requests queued, and PCIe copies a slot in a few
#: milliseconds; small enough to pin once per process without notice.
PINNED_POOL_DEFAULT = 256 << 20

#: Slots of the pinned ring a CUDA load reads through and a save from CUDA
#: writes through: a load reads into every slot whose last copy to the device
#: has completed (one native read of the whole load, its requests in flight
#: across slots), while the slots read before are copied to the device.
PINNED_RING_SLOTS = 4


#: Default of :func:`keep_freed`: at most this, and at most an eighth of the machine's memory.
KEEP_FREED_DEFAULT = 1 << 30


def keep_freed() -> int:
    """``PYFASTENSOR_KEEP_FREED``: bytes of page-aligned load memory that freed tensors leave
    for the next load to reuse (``pyfastensor.empty_cache()`` releases them; ``0`` keeps
    none). Default: 1G, or an eighth of the machine's memory if less."""
    raw = os.environ.get("PYFASTENSOR_KEEP_FREED")
    if not raw:
        try:
            eighth = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 8
        except (ValueError, OSError):
            eighth = KEEP_FREED_DEFAULT
        return min(KEEP_FREED_DEFAULT, eighth)
    try:
        return parse_size(raw)
    except ValueError as e:
        raise ValueError(f"PYFASTENSOR_KEEP_FREED: {e}") from None


def pinned_pool() -> int:
    """``PYFASTENSOR_PINNED_POOL``: bytes of pinned host memory each CUDA path may stage
    through, allocated once per process and reused (default 256M; at least 1M): CUDA
    loads and saves (each a ring of :data:`PINNED_RING_SLOTS` slots); ``async_save``
    snapshots and offload have their own bounds (:func:`snapshot_pool`,
    :func:`offload_pinned`)."""
    return _pinned_size("PYFASTENSOR_PINNED_POOL", PINNED_POOL_DEFAULT)


def offload_pinned() -> int:
    """``PYFASTENSOR_OFFLOAD_PINNED``: bytes of pinned host memory the staging of one
    offload object may hold (CUDA activations: the host tier's stored copies, the SSD
    tier's writes in flight and read-backs), grown in its first step to what a step
    needs and reused after (default: half of the machine's physical memory; at least 1M).
    Buffers past it come from torch's pinned allocator, allocated as they are needed."""
    return _pinned_size("PYFASTENSOR_OFFLOAD_PINNED", _memory_fraction(2, 8 << 30))


def snapshot_pool() -> int:
    """``PYFASTENSOR_SNAPSHOT_POOL``: bytes of pinned host memory an ``async_save`` of CUDA
    tensors may hold for its snapshot (at least 1M). The snapshot buffer is allocated at the
    size the state needs (a power of two: torch's caching host allocator rounds up to one),
    up to this, and kept for the next saves; a larger state goes in waves through this much.
    Default: an eighth of the machine's memory."""
    return _pinned_size("PYFASTENSOR_SNAPSHOT_POOL", _memory_fraction(8, 1 << 30))


#: Default of :func:`dcp_staging`.
DCP_STAGING_DEFAULT = 1 << 30


def dcp_staging() -> int:
    """``PYFASTENSOR_DCP_STAGING``: bytes of pinned host memory one rank's
    :mod:`pyfastensor.dcp` save or load stages device tensors through at once (at least 1M).
    A rank's device items go in waves of at most this much (an item larger than it alone): on
    save each wave is copied to the host and written as a data file of its own, on load read
    and copied to the device before the next. Default 1G: a wave's copies take about 20 ms at
    PCIe speed against half a second of disk, and eight ranks of a node pin 8G at most."""
    return _pinned_size("PYFASTENSOR_DCP_STAGING", DCP_STAGING_DEFAULT)


def _memory_fraction(n: int, fallback: int) -> int:
    """A ``1/n`` share of the machine's physical memory (``fallback`` where it cannot be read)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // n)
    except (ValueError, OSError):
        return fallback


def _pinned_size(name: str, default: int) -> int:
    """A byte count of pinned memory from the environment variable ``name`` (at least 1M),
    ``default`` when unset; the error names the variable."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = parse_size(raw)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    if value < 1 << 20:
        raise ValueError(f"{name}={raw!r}: expected at least 1M")
    return value


_CUDA_LOAD = ("auto", "cufile", "pinned")


def cuda_load() -> str:
    """``PYFASTENSOR_CUDA_LOAD``: how ``load(map_location="cuda")`` moves records:
    ``auto`` (cuFile where it works, else the pinned ring; the default),
    ``cufile`` (cuFile or an error saying why not) or ``pinned`` (the pinned ring)."""
    raw = os.environ.get("PYFASTENSOR_CUDA_LOAD", "auto").strip().lower() or "auto"
    if raw not in _CUDA_LOAD:
        raise ValueError(f"PYFASTENSOR_CUDA_LOAD={raw!r}: expected one of {', '.join(_CUDA_LOAD)}")
    return raw
