"""The CUDA staging path (pinned buffers, side stream), driven by a fake backend on CPU tensors.

No GPU here: these tests check the order of the stream operations and that
bytes arrive intact, which is what the real backend's calls must do too.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from pyfastensor.offload._staging import CudaBackend, Staging


class FakeStream:
    def __init__(self, name: str, log: list[tuple[Any, ...]]) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(("wait", self.name, other.name))

    def wait_event(self, event: FakeEvent) -> None:
        self.log.append(("wait_event", self.name, event.stream))


class FakeEvent:
    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log, self.done, self.stream = log, False, ""

    def record(self, stream: FakeStream) -> None:
        self.stream = stream.name
        self.log.append(("event", stream.name))

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.log.append(("sync",))
        self.done = True


class FakeBackend:
    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.events: list[FakeEvent] = []
        self.compute = FakeStream("compute", self.log)
        self.current = self.compute

    def side_stream(self, device: torch.device) -> FakeStream:
        self.log.append(("new side", str(device)))
        return FakeStream("side", self.log)

    def current_stream(self, device: torch.device) -> FakeStream:
        return self.current

    @contextlib.contextmanager
    def use(self, stream: FakeStream):
        before, self.current = self.current, stream
        self.log.append(("use", stream.name))
        try:
            yield
        finally:
            self.current = before

    def event(self) -> FakeEvent:
        e = FakeEvent(self.log)
        self.events.append(e)
        return e

    def pinned(self, nbytes: int) -> torch.Tensor:
        self.log.append(("pinned", nbytes))
        return torch.empty(nbytes, dtype=torch.uint8)

    def record(self, t: torch.Tensor, stream: FakeStream) -> None:
        self.log.append(("record", stream.name))

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src)

    def empty(self, nbytes: int, device: torch.device) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)


def test_to_host_copies_on_the_side_stream_after_compute():
    b = FakeBackend()
    st = Staging(b)
    payload = torch.randn(1000).half()
    host, landed = st.to_host(payload)
    assert b.log[:3] == [("new side", "cpu"), ("wait", "side", "compute"), ("pinned", 2000)]
    assert b.log[3:] == [("use", "side"), ("event", "side"), ("record", "side")]
    landed()
    assert b.log[-1] == ("sync",), "the store may read the buffer only after the copy's event"
    assert torch.equal(host.view(torch.float16), payload)


def test_to_device_issues_the_copy_and_join_makes_compute_wait_for_its_event():
    b = FakeBackend()
    st = Staging(b)
    host = st.pinned(4096)
    host.copy_(torch.arange(4096) % 251)
    up = st.to_device(host, torch.device("cpu"))
    assert not any(e[0] in ("wait", "wait_event") and e[1] == "compute" for e in b.log), \
        "issuing an upload (a prefetch) does not hold up the compute stream"
    out = st.join(up, torch.device("cpu"))
    assert torch.equal(out, host)
    assert b.log[-2:] == [("wait_event", "compute", "side"), ("record", "compute")], \
        "compute waits for the upload's event, and the output is in use on compute"
    assert ("sync",) not in b.log, "the CPU never waits"


def test_a_pinned_buffer_is_reused_only_after_its_copy_event():
    b = FakeBackend()
    st = Staging(b)
    host = st.pinned(4096)
    st.to_device(host, torch.device("cpu"))
    del host  # nothing refers to the buffer, but its upload has not completed
    again = st.pinned(4096)
    assert st.pool.allocations == 2 and ("sync",) not in b.log, "before seal: grow, do not wait"
    del again
    st.pool.seal()
    kept = st.pinned(4096)  # the buffer no copy uses: no wait
    assert st.pool.waits == 0 and ("sync",) not in b.log
    got = st.pinned(4096)  # only the first buffer is free, its upload still running
    assert st.pool.waits == 1 and b.log[-1] == ("sync",), "sealed: waited for the upload before reuse"
    assert st.pool.allocations == 2 and st.pool.late == 0
    del got, kept
    b.events[0].done = True
    st.close()
    assert st.pool.reserved == 0

def test_one_side_stream_per_device():
    b = FakeBackend()
    st = Staging(b)
    for _ in range(3):
        st.to_host(torch.ones(8))
    assert b.log.count(("new side", "cpu")) == 1


def test_default_backend_is_cuda():
    assert isinstance(Staging().backend, CudaBackend)
