"""What a benchmark's child process shares with the benchmark that started it: its own
imports only, so that a reader measured in its cgroup loads nothing it would not load
anyway."""

from __future__ import annotations

import os
import sys
from typing import TextIO


def reply_channel() -> TextIO:
    """The child's line to the benchmark (``ready``, then its result): stdout as it was,
    while file descriptor 1 goes to stderr from here on, so that nothing a library prints
    (gloo's C++ writes to stdout in some torch releases) comes between the lines the
    benchmark reads. Call it first thing in the child."""
    sys.stdout.flush()
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return reply
