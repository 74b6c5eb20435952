"""Ctrl-C during a long save or load: raised once the native transfer has ended, never while it
still reads or writes the caller's tensors."""

from __future__ import annotations

import threading

import pytest

from pyfastensor.checkpoint import _progress


class _InterruptedOnce:
    """A thread whose first ``join`` is interrupted, as Ctrl-C interrupts the caller's wait; a
    later ``join`` lets the transfer finish (``go``) and waits for it."""

    def __init__(self, thread: threading.Thread, go: threading.Event) -> None:
        self.thread, self.go, self.joins = thread, go, 0

    def join(self, timeout: float | None = None) -> None:
        self.joins += 1
        if self.joins == 1:
            raise KeyboardInterrupt
        self.go.set()
        self.thread.join(timeout)

    def is_alive(self) -> bool:
        return self.thread.is_alive()


@pytest.mark.parametrize("how", ["wait", "settle"])
def test_an_interrupt_is_raised_after_the_transfer_ends(how: str, capsys: pytest.CaptureFixture[str]) -> None:
    go, finished = threading.Event(), threading.Event()

    def transfer(counter: object) -> int:  # stands for a native call using the caller's tensors
        go.wait()
        finished.set()
        return 7

    pending = _progress.Pending(transfer, 1 << 30, "saving", progress=False)
    real = pending._thread
    pending._thread = _InterruptedOnce(real, go)  # type: ignore[assignment]
    try:
        with pytest.raises(KeyboardInterrupt):
            getattr(pending, how)()
        assert finished.is_set(), "the interrupt was raised while the transfer still ran"
        assert "waiting for the transfer in flight to end" in capsys.readouterr().err
    finally:
        go.set()
        real.join()
