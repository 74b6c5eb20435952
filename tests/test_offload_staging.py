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


class FakeEvent:
    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log, self.done = log, False

    def record(self, stream: FakeStream) -> None:
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


def test_to_device_makes_compute_wait_and_keeps_the_pinned_source():
    b = FakeBackend()
    st = Staging(b)
    host = st.pinned(4096)
    host.copy_(torch.arange(4096) % 251)
    out = st.to_device(host, torch.device("cpu"))
    assert torch.equal(out, host)
    assert ("wait", "compute", "side") in b.log, "compute waits for the upload, not the CPU"
    assert ("sync",) not in b.log
    assert len(st._inflight) == 1 and st._inflight[0][1] is host
    st.to_device(host, torch.device("cpu"))
    assert len(st._inflight) == 2, "an upload whose event has not completed keeps its buffer"
    b.events[0].done = True
    st.to_device(host, torch.device("cpu"))
    assert len(st._inflight) == 2, "finished uploads drop their buffers"
    st.close()
    assert st._inflight == [] and b.log.count(("sync",)) == 2


def test_one_side_stream_per_device():
    b = FakeBackend()
    st = Staging(b)
    for _ in range(3):
        st.to_host(torch.ones(8))
    assert b.log.count(("new side", "cpu")) == 1


def test_default_backend_is_cuda():
    assert isinstance(Staging().backend, CudaBackend)
