"""The CUDA staging path (pinned buffers, side stream), driven by the fake CUDA backend on CPU tensors.

No GPU here: these tests check the order of the stream operations and that
bytes arrive intact, which is what the real backend's calls must do too.
The fake runs a side stream's copy only when something waits for it (an
event synchronized, a stream told to wait), and a copy holds only the
address of its pinned buffer, as on a GPU: a buffer read or reused before
its copy has run holds the wrong bytes.
"""

from __future__ import annotations

import torch
from cuda_fakes import FakeCuda

from pyfastensor.offload._staging import CudaBackend, Staging

CPU = torch.device("cpu")


def test_to_host_copies_on_the_side_stream_after_compute() -> None:
    fake = FakeCuda()
    st = Staging(fake)
    payload = torch.randn(1000).half()
    host, landed = st.to_host(payload)
    assert fake.sides == 1 and fake.pinned_calls == [2000]
    assert fake.copies == [("side1", 2000)]
    assert fake.log == [("wait", "side1", "compute"), ("event", "side1"), ("record", "side1")], \
        "the side stream waits for compute, copies, records the copy's event; the payload is in use there"
    assert not fake.syncs and not torch.equal(host.view(torch.float16), payload), "nothing waited for the copy"
    landed()
    assert fake.log[-1] == ("sync", "side1"), "the store may read the buffer only after the copy's event"
    assert torch.equal(host.view(torch.float16), payload)


def test_to_device_issues_the_copy_and_join_makes_compute_wait_for_its_event() -> None:
    fake = FakeCuda()
    st = Staging(fake)
    host = st.pinned(4096)
    host.copy_(torch.arange(4096) % 251)
    up = st.to_device(host, CPU)
    assert fake.copies == [("side1", 4096)]
    assert not any(e[0] in ("wait", "wait_event") and e[1] == "compute" for e in fake.log), \
        "issuing an upload (a prefetch) does not hold up the compute stream"
    out = st.join(up, CPU)
    assert torch.equal(out, host)
    assert fake.log[-2:] == [("wait_event", "compute", "side1"), ("record", "compute")], \
        "compute waits for the upload's event, and the output is in use on compute"
    assert not fake.syncs, "the CPU never waits"


def test_a_pinned_buffer_is_reused_only_after_its_copy_event() -> None:
    fake = FakeCuda()
    st = Staging(fake)
    host = st.pinned(4096)
    want = torch.arange(4096).to(torch.uint8)
    host.copy_(want)
    up = st.to_device(host, CPU)
    del host  # nothing refers to the buffer, but its upload has not run
    again = st.pinned(4096)
    assert st.pool.allocations == 2 and not fake.syncs, "before seal: grow, do not wait"
    del again
    st.pool.seal()
    kept = st.pinned(4096)  # the buffer no copy uses: no wait
    assert st.pool.waits == 0 and not fake.syncs
    got = st.pinned(4096)  # only the first buffer is free, its upload not run yet
    assert st.pool.waits == 1 and len(fake.syncs) == 1, "sealed: waited for the upload before reuse"
    assert st.pool.allocations == 2 and st.pool.late == 0
    got.fill_(0)  # its new user writes from the CPU: the upload read the buffer before
    assert torch.equal(st.join(up, CPU), want)
    del got, kept
    st.close()
    assert st.pool.reserved == 0


def test_one_side_stream_per_device() -> None:
    fake = FakeCuda()
    st = Staging(fake)
    for _ in range(3):
        st.to_host(torch.ones(8))
    assert fake.sides == 1


def test_default_backend_is_cuda() -> None:
    assert isinstance(Staging().backend, CudaBackend)
