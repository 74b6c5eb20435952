"""What every benchmark shares: the disk's limit, cold caches, cgroups, paired rounds, output.

- The disk's own limit and cold caches come from pyfastensor's public
  :mod:`pyfastensor.bench.disk`, here as :data:`disk` (the measurements
  ``python -m pyfastensor bench io`` makes too: ``disk.measure_limit``,
  ``disk.drop_caches``, ``disk.cache_files``, ``disk.prime_memory``), the
  checksum's speed from :func:`pyfastensor.bench.crc_speed`.
- Readers held to a memory budget and a read-IOPS throttle run in cgroups
  (v1): :func:`block_device`, :func:`cgroup_support`, :class:`ReaderCgroups`.
- Rows measured in paired, interleaved rounds are compared round by round:
  :func:`paired_ratios`, :func:`spread`, :func:`spread_text`.
- Every benchmark's command line: :func:`add_command` (the subcommand, with
  the options they share), :func:`temp_dir`, :func:`progress`, and its
  output: the report on stdout, :func:`write_json`, :func:`plot_or_say`.

Nothing here imports torch: ``python -m benchmarks --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pyfastensor.bench import crc_speed, disk

__all__ = [
    "ReaderCgroups",
    "add_command",
    "block_device",
    "child_env",
    "cgroup_support",
    "crc_speed",
    "disk",
    "diskstats_read_bytes",
    "freeze_heap",
    "mapped_files",
    "paired_ratios",
    "plot_or_say",
    "progress",
    "save_figure",
    "spread",
    "spread_text",
    "temp_dir",
    "write_json",
]

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

_CGROUP_ROOT = "/sys/fs/cgroup"


# ---------------------------------------------------------------- the command line


def add_command(sub: argparse._SubParsersAction, name: str, *, help: str, description: str | None,
                func: Callable[[argparse.Namespace], int], dir_help: str | None = None,
                json_help: str | None = "write the raw results as JSON",
                limit_help: str | None = None) -> argparse.ArgumentParser:
    """Add the benchmark ``name`` to ``sub``, with the options every benchmark spells alike.

    Args:
        sub: the subcommands of ``python -m benchmarks``.
        name: the subcommand.
        help: one line for ``python -m benchmarks --help``.
        description: the benchmark's ``--help`` text (kept as written).
        func: the handler, called with the parsed namespace.
        dir_help: ``--dir``'s help, or None for no ``--dir``.
        json_help: ``--json PATH``'s help, or None for no ``--json``.
        limit_help: ``--no-limit``'s help, or None for no ``--no-limit``.

    Returns:
        The subcommand's parser, for the benchmark's own options.
    """
    p = sub.add_parser(name, help=help, description=description,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    if dir_help is not None:
        p.add_argument("--dir", default=None, help=dir_help)
    if json_help is not None:
        p.add_argument("--json", default=None, metavar="PATH", help=json_help)
    if limit_help is not None:
        p.add_argument("--no-limit", action="store_true", help=limit_help)
    p.set_defaults(func=func)
    return p


def progress(line: str) -> None:
    """Say on stderr what runs now (stdout keeps the report)."""
    print(f"  running {line}", file=sys.stderr, flush=True)


def child_env() -> dict[str, str]:
    """This process's environment with the repository root first on ``PYTHONPATH``, for a child
    that runs ``python -m benchmarks.<module>`` from any directory."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@contextlib.contextmanager
def temp_dir(parent: str | os.PathLike[str] | None, name: str) -> Iterator[str]:
    """A temporary directory ``pft-bench-<name>-*`` inside ``parent`` (default ``.``), removed after.

    Raises:
        ValueError: when ``parent`` is not a directory.
    """
    parent = os.fspath(parent) if parent else "."
    if not os.path.isdir(parent):
        raise ValueError(f"--dir {parent!r} is not a directory")
    with tempfile.TemporaryDirectory(prefix=f"pft-bench-{name}-", dir=parent) as d:
        yield d


# ---------------------------------------------------------------- paired rounds


def remove_saved(path: str | os.PathLike[str]) -> None:
    """Remove a saved checkpoint (a file, or a directory of them) if it is there, and sync, before
    a writer is timed: freeing a file's blocks takes the disk's time (a good part of a second for
    2 GB on a filesystem mounted with discard), which no row should pay for another's file."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)
    else:
        return
    os.sync()


def freeze_heap() -> None:
    """Move the objects alive now (torch's, the models', compiled programs) out of the garbage
    collector's passes (:func:`gc.freeze`), as training loops that care about step time do.

    A full collection over them stalls whichever timed call it falls in: 180-190 ms in one timed
    DCP save in five here; 300-400 ms in the same Pareto row's profiling step in three runs, as
    the rows before it had built their compiled programs.
    """
    gc.collect()
    gc.freeze()


def round_order(items: Sequence[str], r: int) -> list[str]:
    """The order of ``items`` in round ``r``: rotated by one a round, so each takes the first place
    in turn. The first right after the disk's limit was measured ran slower (a GPT-2 cold load:
    260 ms first, 180 ms second, medians of 4), and no tool should always take that place."""
    k = r % len(items) if items else 0
    return [*items[k:], *items[:k]]


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Round by round ``b[i] / a[i]`` of two rows timed in the same interleaved rounds.

    A disturbance from the rest of the machine lands on both rows of a round
    alike, so the per-round ratio cancels the slow drifts a ratio of medians
    keeps. Rounds where ``a`` is 0 are left out.
    """
    return [y / x for x, y in zip(a, b, strict=False) if x]


def spread(xs: Sequence[float]) -> dict[str, float]:
    """Median, min and max of ``xs`` (non-empty)."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def spread_text(xs: Sequence[float], fmt: str = ".2f") -> str:
    """``"min-max"`` of ``xs`` in ``fmt``, or ``"-"`` when empty."""
    return f"{min(xs):{fmt}}-{max(xs):{fmt}}" if xs else "-"


def target_lines(targets: Sequence[dict[str, Any]]) -> list[str]:
    """One line a target (``{"target", "ratios", "median", "met"}``, ``"why"`` optional): met,
    NOT MET or not measured, its median and spread, and why where it was not measured."""
    lines = []
    for t in targets:
        state = {True: "met", False: "NOT MET", None: "not measured"}[t["met"]]
        med = "-" if t["median"] is None else f"{t['median']:.2f}"
        why = f" ({t['why']})" if t.get("why") else ""
        spread = f" ({spread_text(t['ratios'])})" if len(t["ratios"]) > 1 else ""
        lines.append(f"  {state:<12} {t['target']}: {'median ' if spread else ''}{med}{spread}{why}")
    return lines


# ---------------------------------------------------------------- output


def write_json(result: Any, path: str | os.PathLike[str], *, what: str = "raw results") -> Path:
    """Write ``result`` as indented JSON at ``path`` (its directory made if needed; values JSON
    does not know, numpy's floats among them, as floats) and say where."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=float))
    print(f"{what}: {out}")
    return out


def save_figure(fig: Any, path: str | os.PathLike[str], *, dpi: int = 110) -> Path:
    """Save a matplotlib figure at ``path``, its directory made if needed; return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    return out


def finish(result: Any, args: Any, format_report: Callable[[Any], str],
           plot: Callable[[Any, str], Path] | None = None) -> int:
    """The end of a benchmark command: print the report, write ``--json``, draw ``--plot`` unless ``--no-plot``.

    Returns:
        The command's exit status, 0.
    """
    print(format_report(result))
    if getattr(args, "json", None):
        write_json(result, args.json)
    if plot is not None and not getattr(args, "no_plot", False):
        plot_or_say(plot, result, args.plot)
    return 0


def plot_or_say(plot: Callable[[Any, str], Path], result: Any, path: str) -> None:
    """Draw ``plot(result, path)`` and say where, or say why not where matplotlib is missing."""
    try:
        print(f"plot: {plot(result, path)}")
    except ImportError:
        print("plot: skipped, matplotlib is not installed (pip install -r benchmarks/requirements.txt)")


# ---------------------------------------------------------------- cgroups and the device


def block_device(path: str | os.PathLike[str]) -> tuple[str, str]:
    """The whole disk under ``path``'s filesystem as ``"major:minor"``, and its name; or ``("", why)``.

    A partition is mapped to its disk (the throttle applies to disks).
    """
    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    sys_dev = Path(f"/sys/dev/block/{major}:{minor}")
    if major == 0 or not sys_dev.exists():
        return "", f"{path} is on no block device ({major}:{minor}: tmpfs, overlay or a network filesystem)"
    real = sys_dev.resolve()
    if (real / "partition").exists():
        real = real.parent
    try:
        return (real / "dev").read_text().strip(), real.name
    except OSError as e:
        return "", f"cannot read {real / 'dev'}: {e.strerror}"


def diskstats_read_bytes(device: str) -> int | None:
    """Bytes read from ``device`` (``major:minor``) since boot, from ``/proc/diskstats``; None if absent."""
    if not device:
        return None
    major, minor = device.split(":")
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                p = line.split()
                if p[0] == major and p[1] == minor:
                    return int(p[5]) * 512
    except OSError:
        return None
    return None


def _own_cgroup(controller: str) -> str:
    """This process's cgroup v1 path in ``controller`` ("/" if unknown)."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            if controller in ctrls.split(","):
                return path
    except OSError:
        pass
    return "/"


def cgroup_support(device: str) -> dict[str, str]:
    """What the cgroups can do here: ``memory``, ``blkio``, ``throttle``: ``""`` if it can, else why not."""
    why = {"memory": "", "blkio": "", "throttle": ""}
    if os.geteuid() != 0:
        why = dict.fromkeys(why, "not root (run as root for the cgroups)")
        return why
    for ctrl, probe in (("memory", "memory.limit_in_bytes"), ("blkio", "blkio.throttle.io_service_bytes")):
        base = Path(_CGROUP_ROOT, ctrl)
        if not (base / probe).exists():
            why[ctrl] = f"no cgroup v1 {ctrl} controller at {base}"
    if why["blkio"]:
        why["throttle"] = why["blkio"]
    elif not device:
        why["throttle"] = why["blkio"] = "the data directory is on no block device"
    elif not Path(_CGROUP_ROOT, "blkio", "blkio.throttle.read_iops_device").exists():
        why["throttle"] = "no blkio.throttle.read_iops_device (kernel without blk-throttle)"
    return why


class ReaderCgroups:
    """A memory and a blkio cgroup (v1) for one reader process, removed by :meth:`remove`.

    Each is made inside this process's own cgroup of the controller, so the
    machine's accounting above it still holds the reader.

    Args:
        name: the cgroups' directory name.
        support: :func:`cgroup_support`'s answer; a controller it refuses is not made.
        memory_limit: bytes for ``memory.limit_in_bytes`` (memory and page cache).
        device: ``major:minor`` of the disk, for the counters and the throttle.
        iops: read IOPS limit, or 0 for none.
    """

    def __init__(self, name: str, support: dict[str, str], *, memory_limit: int, device: str,
                 iops: int = 0) -> None:
        self.device = device
        self.dirs: dict[str, Path] = {}
        self.notes: list[str] = []
        for ctrl in ("memory", "blkio"):
            if support[ctrl]:
                continue
            d = Path(_CGROUP_ROOT, ctrl, _own_cgroup(ctrl).lstrip("/"), name)
            try:
                d.mkdir()
            except OSError as e:
                self.notes.append(f"{ctrl} cgroup {d}: {e.strerror}")
                continue
            self.dirs[ctrl] = d
        try:
            if "memory" in self.dirs:
                (self.dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory_limit))
            if iops and "blkio" in self.dirs and not support["throttle"]:
                (self.dirs["blkio"] / "blkio.throttle.read_iops_device").write_text(f"{device} {iops}")
        except OSError as e:
            self.remove()
            raise OSError(e.errno, f"setting up the reader's cgroups: {e.strerror}") from e

    def join(self) -> None:
        """Move the calling process into the cgroups (``preexec_fn`` of the reader)."""
        for d in self.dirs.values():
            (d / "cgroup.procs").write_text(str(os.getpid()))

    def peak_memory(self) -> int | None:
        """``memory.max_usage_in_bytes`` (memory and page cache), or None without a memory cgroup."""
        d = self.dirs.get("memory")
        return int((d / "memory.max_usage_in_bytes").read_text()) if d else None

    def reset_peak(self) -> None:
        """Restart ``memory.max_usage_in_bytes`` from the current usage."""
        d = self.dirs.get("memory")
        if d:
            (d / "memory.max_usage_in_bytes").write_text("0")

    def oom_kills(self) -> int:
        """Processes the memory cgroup's OOM killer killed (``oom_kill`` of ``memory.oom_control``;
        0 without a memory cgroup or on kernels without the counter)."""
        d = self.dirs.get("memory")
        if d is None:
            return 0
        for line in (d / "memory.oom_control").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def read_bytes(self) -> int | None:
        """Bytes the reader read from the device (``blkio.throttle.io_service_bytes``), or None."""
        return self._blkio("blkio.throttle.io_service_bytes")

    def read_ios(self) -> int | None:
        """Read requests the reader sent to the device (``blkio.throttle.io_serviced``), or None."""
        return self._blkio("blkio.throttle.io_serviced")

    def _blkio(self, name: str) -> int | None:
        d = self.dirs.get("blkio")
        if d is None:
            return None
        total = 0
        for line in (d / name).read_text().splitlines():
            p = line.split()
            if len(p) == 3 and p[0] == self.device and p[1] == "Read":
                total += int(p[2])
        return total

    def remove(self) -> None:
        """Remove the cgroups (their processes must have exited); idempotent."""
        for ctrl, d in list(self.dirs.items()):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)  # the last task leaves the cgroup just after it exits
            self.dirs.pop(ctrl)



def mapped_files(pid: int, *, exclude: Path | None = None) -> list[str]:
    """The regular files process ``pid`` has mapped (its libraries), less those under ``exclude``."""
    out: set[str] = set()
    skip = str(Path(exclude).resolve()) + os.sep if exclude is not None else None
    try:
        text = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/") or parts[5].endswith("(deleted)"):
            continue
        path = parts[5]
        if path.startswith("/dev/") or (skip and path.startswith(skip)):
            continue
        if os.path.isfile(path):
            out.add(path)
    return sorted(out)


