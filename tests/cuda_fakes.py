"""A fake CUDA backend over CPU tensors, and the fake libcufile, for testing the CUDA paths without a GPU.

:class:`FakeCuda` implements :class:`pyfastensor._device.Backend` the way a
GPU behaves where it matters for correctness: a copy issued on a side
stream does not happen when it is issued, but when an event recorded after
it on that stream is synchronized (or another stream waits for it). Code
that reads a pinned buffer before waiting for its copy's event, or reuses
a buffer whose copy has not run, reads or clobbers the wrong bytes here
just as it would on a GPU: a copy in flight holds its device-side tensor
(the caching allocator keeps device memory for its stream) but only the
address of its pinned buffer, which the fake never frees (torch's host
allocator keeps its blocks). :meth:`FakeCuda.catch_up` runs every copy
issued, as a GPU has by the end of a step. "Device memory" is CPU memory.

``gate``: while cleared, synchronizing an event whose copies have not run
blocks (a copy still in flight), so a test can check what happens before a
copy completes.
``syncs`` records the thread of every ``event.synchronize()`` (a CPU wait),
``pinned_calls`` every pinned allocation (what torch's caching host
allocator would get a ``cudaHostAlloc`` for when it has no free block).
``device_live`` and ``device_peak``: bytes of "device" memory (:meth:`FakeCuda.empty`)
alive now and at most, as ``torch.cuda.memory_allocated`` would count them.

Run as a script (``python cuda_fakes.py <checkpoint> <map_location>``), it
loads the checkpoint to "cuda" through the fake backend and prints a JSON
line (the route taken, whether the bytes equal torch.load's): the cuFile
tests run it in a child process whose dynamic loader finds the fake
libcufile and a stand-in libcuda.so.1 (:func:`fake_cufile_env`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from checkpoint_helpers import evict

ROOT = Path(__file__).resolve().parent.parent


class FakeStream:
    def __init__(self, backend: FakeCuda, name: str) -> None:
        self.backend, self.name = backend, name
        self.ops: list[Callable[[], None] | None] = []
        self.done = 0  # ops run so far
        self.lock = threading.Lock()  # the store's thread waits for events too

    def run_until(self, n: int) -> None:
        """Run the ops up to the n-th. An op counts as done (its events complete) only once it
        has run: another thread's ``query`` sees a copy still running as in flight."""
        with self.lock:
            while self.done < n:
                op, self.ops[self.done] = self.ops[self.done], None  # let its tensors go once run
                assert op is not None
                op()
                self.done += 1

    def wait_stream(self, other: FakeStream) -> None:
        self.backend.log.append(("wait", self.name, other.name))
        other.run_until(len(other.ops))  # conservative: what self runs next comes after all of it

    def wait_event(self, event: FakeEvent) -> None:
        """What self runs next comes after the event's stream's ops up to it (a device-side wait:
        the CPU does not block; here the ops simply run now)."""
        self.backend.log.append(("wait_event", self.name, event.stream.name if event.stream else ""))
        if event.stream is not None:
            event.stream.run_until(event.at)

    def synchronize(self) -> None:
        self.run_until(len(self.ops))


class FakeEvent:
    def __init__(self, backend: FakeCuda) -> None:
        self.backend = backend
        self.stream: FakeStream | None = None
        self.at = 0
        self.completed = False

    def record(self, stream: FakeStream) -> None:
        self.stream, self.at = stream, len(stream.ops)
        self.backend.log.append(("event", stream.name))

    def query(self) -> bool:  # done once the stream has run past it (a wait_stream runs it)
        if not self.completed and self.stream is not None:
            self.completed = self.stream.done >= self.at
        return self.completed

    def synchronize(self) -> None:
        self.backend.syncs.append(threading.current_thread())
        if self.query():  # its copies ran already: nothing in flight to wait for
            self.backend.log.append(("sync", self.stream.name if self.stream else ""))
            return
        if not self.backend.gate.wait(timeout=60):
            raise AssertionError("a copy's event was waited for while the test held copies in flight")
        if self.stream is not None:
            self.stream.run_until(self.at)
        self.completed = True
        self.backend.log.append(("sync", self.stream.name if self.stream else ""))


class FakeCuda:
    """:class:`pyfastensor._device.Backend` over CPU tensors, with deferred side-stream copies.

    Args:
        devices: how many "CUDA devices" :meth:`device` accepts.
    """

    def __init__(self, devices: int = 2) -> None:
        self.devices = devices
        self.log: list[tuple[Any, ...]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.compute = FakeStream(self, "compute")
        self._current = threading.local()  # per thread, as CUDA's current stream is
        self._streams: list[FakeStream] = []  # the side streams, in the order made
        self.pinned_calls: list[int] = []  # sizes of pinned allocations
        self.syncs: list[threading.Thread] = []  # the thread of each event.synchronize()
        self.empties: list[tuple[int, str]] = []  # (bytes, location asked for) of device allocations
        self.copies: list[tuple[str, int]] = []  # (stream, bytes) of copies issued
        self._asked = ""
        self._pinned: list[torch.Tensor] = []  # never freed: a copy in flight holds only its address
        self.device_live = 0  # bytes of device allocations alive now
        self.device_peak = 0
        self._device_lock = threading.RLock()  # _device_free is a finalizer: it may run inside empty()

    @property
    def current(self) -> FakeStream:
        """This thread's current stream: the compute stream unless :meth:`use` made another current."""
        return getattr(self._current, "stream", self.compute)

    @property
    def sides(self) -> int:
        """Side streams made so far."""
        return len(self._streams)

    def side_stream(self, device: torch.device) -> FakeStream:
        stream = FakeStream(self, f"side{self.sides + 1}")
        self._streams.append(stream)
        return stream

    def catch_up(self) -> None:
        """Run every copy issued so far, as a GPU has by the time a training step ends: the next
        step finds their events complete (a pinned buffer let go with its copy unread is free
        then, not in flight)."""
        for stream in self._streams:
            stream.synchronize()

    def current_stream(self, device: torch.device) -> FakeStream:
        return self.current

    @contextlib.contextmanager
    def use(self, stream: FakeStream) -> Iterator[None]:
        before, self._current.stream = self.current, stream
        try:
            yield
        finally:
            self._current.stream = before

    def event(self) -> FakeEvent:
        return FakeEvent(self)

    def pinned(self, nbytes: int) -> torch.Tensor:
        self.pinned_calls.append(nbytes)
        t = torch.full((nbytes,), 0xEE, dtype=torch.uint8)  # garbage, not zeros
        self._pinned.append(t)
        return t

    def is_pinned(self, addr: int) -> bool:
        """Whether ``addr`` lies in pinned memory this backend handed out (host memory, not
        "device" memory, though both are CPU memory here)."""
        return any(t.data_ptr() <= addr < t.data_ptr() + t.numel() for t in self._pinned)

    def record(self, t: torch.Tensor, stream: FakeStream) -> None:
        self.log.append(("record", stream.name))

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        stream = self.current
        self.copies.append((stream.name, dst.numel() * dst.element_size()))
        if stream is self.compute:
            dst.copy_(src)
            return
        # A GPU's copy in flight keeps no tensor alive. Device memory stays allocated for the
        # stream (the caching allocator), so the op holds the device-side tensor; pinned memory
        # is reused as soon as its owner hands it out again, whatever copy still uses it (the
        # pool's buffers), so the op holds only its address: a buffer reused before its copy
        # has run gives that copy the new bytes, as on a GPU.
        n = dst.numel() * dst.element_size()
        if not (dst.is_contiguous() and src.is_contiguous() and dst.dtype == src.dtype
                and n == src.numel() * src.element_size()):
            raise AssertionError(f"fake CUDA: a copy of {tuple(src.shape)} {src.dtype} into "
                                 f"{tuple(dst.shape)} {dst.dtype} is not one of whole contiguous bytes")
        held = [t for t in (dst, src) if not self.is_pinned(t.data_ptr())]
        to, frm = dst.data_ptr(), src.data_ptr()

        def op(_alive: list[torch.Tensor] = held) -> None:  # the device-side tensors live until it runs
            ctypes.memmove(to, frm, n)
        stream.ops.append(op)

    def device(self, location: str) -> torch.device:
        d = torch.device(location)
        if d.type != "cuda" or (d.index or 0) >= self.devices:
            raise RuntimeError(f"fake CUDA: no device {location!r}")
        self._asked = location
        return torch.device("cpu")

    def empty(self, nbytes: int, device: torch.device) -> torch.Tensor:
        self.empties.append((nbytes, self._asked))
        t = torch.full((nbytes,), 0xDD, dtype=torch.uint8)
        with self._device_lock:
            self.device_live += nbytes
            self.device_peak = max(self.device_peak, self.device_live)
        weakref.finalize(t.untyped_storage(), self._device_free, nbytes)  # lives as long as its memory
        return t

    def _device_free(self, nbytes: int) -> None:
        with self._device_lock:
            self.device_live -= nbytes

    def reset_device_peak(self) -> None:
        with self._device_lock:
            self.device_peak = self.device_live


def fake_offload(fake: FakeCuda, spill_dir: Path, module: torch.nn.Module, *, min_size: int = 16 << 10,
                 pool_limit: int = 1 << 30, **options: Any) -> Any:
    """``pyfastensor.offload(spill_dir=, min_size=, module=, **options)`` whose CUDA tensors
    are staged through ``fake`` (its device, streams and pinned allocator), the pinned pool
    capped at ``pool_limit``."""
    import pyfastensor
    from pyfastensor.offload._staging import Staging

    off = pyfastensor.offload(spill_dir=str(spill_dir), min_size=min_size, module=module, **options)
    off._device_staging = Staging(fake, pool_limit=pool_limit)
    return off


def build_fake_cufile(where: Path) -> Path | None:
    """Build the fake libcufile and the fake libcuda.so.1 (gds/testdata/fakecufile: the
    driver calls the cuFile probe gets device memory from, served from host memory) into
    ``where``; None when there is no C compiler."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        return None
    where.mkdir(parents=True, exist_ok=True)
    lib = where / "libcufile.so.0"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(lib), str(ROOT / "gds/testdata/fakecufile/fakecufile.c")],
                   check=True, capture_output=True)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(where / "libcuda.so.1"),
                    str(ROOT / "gds/testdata/fakecufile/fakecuda.c")], check=True, capture_output=True)
    return lib


def fake_cufile_env(lib: Path, **extra: str) -> dict[str, str]:
    """The environment of a child process that loads the fake libcufile: the probe finds the
    fake NVIDIA driver library beside it."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{lib.parent}:{env.get('LD_LIBRARY_PATH', '')}"
    env["PYFASTENSOR_CUFILE_LIB"] = str(lib)
    env["FAKECUFILE_CONTEXT"] = "libcuda.so.1"  # its transfers need a context current, as device memory does
    env["PYTHONPATH"] = f"{ROOT}:{env.get('PYTHONPATH', '')}"
    env.update(extra)
    return env


def run_child(path: Path, map_location: str, env: dict[str, str], *, fail_read: bool = False,
              twice: bool = False, warm: bool = False) -> dict[str, Any]:
    """Run this file as a script in a child process (see the module docstring); its JSON line.
    ``fail_read``: the fake libcufile fails the third cuFileRead. ``twice``: load twice (the
    second result is reported). Each load finds the file out of the page cache (its pages
    dropped first), unless ``warm``. The line also holds ``warnings`` (the warnings the loads
    issued), ``info`` (``info()["dir"]`` of the file's directory, cuFile fields, after) and
    ``reads_before_pending_work``: how many cuFileReads had been made when work queued on the
    current stream before the load ran (a GPU runs a read not ordered after it alongside it)."""
    import json
    import sys

    extra = ["fail-read"] if fail_read else []
    extra += ["twice"] if twice else []
    extra += ["warm"] if warm else []
    out = subprocess.run([sys.executable, __file__, str(path), map_location, *extra], env=env,
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise AssertionError(f"child failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@contextlib.contextmanager
def _locked_in_cache(path: str) -> Iterator[None]:
    """``path``'s pages in the page cache, locked there (mlock of a mapping of it), so that no
    other test dropping the caches meanwhile (echo 3 > drop_caches) makes the file cold."""
    import mmap

    import numpy as np

    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        view = np.frombuffer(m, dtype=np.uint8)
        addr, n = view.ctypes.data, view.nbytes
        if libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(n)) != 0:
            raise OSError(ctypes.get_errno(), f"mlock of {path}")
        try:
            yield
        finally:
            libc.munlock(ctypes.c_void_p(addr), ctypes.c_size_t(n))
            del view


def _child(path: str, map_location: str, fault: bool, twice: bool = False, warm: bool = False) -> None:
    import ctypes
    import json
    import warnings

    import pyfastensor
    from pyfastensor import _device
    from pyfastensor.checkpoint import _cuda

    fake = FakeCuda()
    _cuda.NVFS = str(ROOT)  # the fake libcufile stands for a machine with GPUDirect Storage's driver
    result: dict[str, Any] = {}
    lib = os.environ.get("PYFASTENSOR_CUFILE_LIB", "")
    fake_lib = None
    if lib and os.path.exists(lib):
        fake_lib = ctypes.CDLL(lib)  # the copy the Go core loads: its counters and faults
        for fn in ("fake_calls", "fake_fail_next"):
            getattr(fake_lib, fn).restype = ctypes.c_long
            getattr(fake_lib, fn).argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_long]
    pending: dict[str, int] = {}
    if fake_lib is not None:  # work the caller queued before the load, not yet run
        pyfastensor.info(os.path.dirname(path))  # the probe's own read made first
        probed = fake_lib.fake_calls(7, 0, 0)
        fake.current.ops.append(lambda: pending.setdefault("reads", fake_lib.fake_calls(7, 0, 0) - probed))
    if fault and fake_lib is not None:
        pyfastensor.info()  # the probe loads the library first
        fake_lib.fake_fail_next(7, 5030, 2)  # the third cuFileRead fails: CU_FILE_INTERNAL_ERROR
    try:
        with _device.using(fake), warnings.catch_warnings(record=True) as caught, \
                (_locked_in_cache(path) if warm else contextlib.nullcontext()):
            warnings.simplefilter("always")
            for _ in range(2 if twice else 1):
                if not warm:
                    evict(path)
                got = pyfastensor.load(path, map_location=map_location,
                                       engine=os.environ.get("PFT_TEST_ENGINE") or None)  # load's engine=, for the tests
        result["warnings"] = [str(w.message) for w in caught]
        want = torch.load(path, map_location="cpu")
        result["equal"] = sorted(got) == sorted(want) and all(
            bytes(got[k].untyped_storage()) == bytes(want[k].untyped_storage())
            and got[k].stride() == want[k].stride() and got[k].storage_offset() == want[k].storage_offset()
            for k in want
        )
        result.update(_cuda.last_route)
    except Exception as e:  # noqa: BLE001 - reported to the parent
        result["error"] = f"{type(e).__name__}: {e}"
    d = pyfastensor.info(os.path.dirname(path))["dir"]
    result["info"] = {k: v for k, v in d.items() if k.startswith("cufile")}
    if fake_lib is not None:
        result["cufile_reads"] = fake_lib.fake_calls(7, 0, 0)
        result["load_cufile_reads"] = result["cufile_reads"] - probed  # the probe's own left out
        fake.current.synchronize()
        result["reads_before_pending_work"] = pending["reads"]
    result["copies"] = len(fake.copies)
    print(json.dumps(result))


if __name__ == "__main__":
    import sys

    _child(sys.argv[1], sys.argv[2], "fail-read" in sys.argv[3:], "twice" in sys.argv[3:], "warm" in sys.argv[3:])
