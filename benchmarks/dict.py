"""``python -m benchmarks dict``: hit rate of the adaptive dictionaries against the oracle.

Remakes the Fastensor paper's measure (section 5.2.3: 88.5-89.2% of the
optimum): a mixed-size workload of training-like iterations (sizes from
4 KiB to 64 MiB, each written then read back once per iteration) through a
real file, every transfer timed with every candidate engine; then the aware
dictionaries are replayed over those times and scored against the oracle,
the best engine on each transfer. The workload and the replay are Go
(``transfer/dict/hitrate``, run by ``go run ./cmd/dicthitrate``, which
prints the report as JSON); this module runs it and prints the table. It
needs Go (the version go.mod names) on the PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from pyfastensor import config

from .harness import add_command

#: The repository root, where ``go run ./cmd/dicthitrate`` runs.
ROOT = Path(__file__).resolve().parents[1]

#: The aware dictionaries should reach this fraction of the oracle.
TARGET = 0.90

_DESCRIPTION = """\
Measure how close the aware dictionaries (WDic, RDic, WRDic) come to the
oracle. A workload of --iterations iterations, each transferring --sizes
distinct sizes log-spaced from --min-size to --max-size once (shuffled), is
laid out in one file in DIR (about --budget bytes, removed at the end).
Every transfer is timed with every candidate engine (--repeat times, median):
a write is WriteAt+fsync, a read starts cold (its range dropped from the
page cache). The dictionaries are then replayed over the measured times:
hit rate = oracle time / chosen time, where the oracle takes the fastest
engine on each transfer; "oracle choice" is the fraction of transfers where
the dictionary chose the oracle's engine. Also printed: the hindsight
dictionary (each bucket's best engine over the whole run, the paper's
"Best" column) and every engine alone ("specific tool"). As root, the page
cache is dropped first (/proc/sys/vm/drop_caches).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``benchmarks dict`` to ``sub``."""
    p = add_command(sub, "dict", help="hit rate of the adaptive dictionaries against the oracle",
                    description=_DESCRIPTION, func=_cmd, json_help=None)
    p.add_argument("dir", nargs="?", default=".", help="directory on the filesystem under test (default: .)")
    p.add_argument("--sizes", type=int, default=None, help="distinct transfer sizes (default 16)")
    p.add_argument("--iterations", type=int, default=None, help="iterations (default 12, fewer over --budget)")
    p.add_argument("--min-size", type=config.parse_size, default=None, help="smallest size (default 4K)")
    p.add_argument("--max-size", type=config.parse_size, default=None, help="largest size (default 64M)")
    p.add_argument("--budget", type=config.parse_size, default=None,
                   help="workload bytes per direction (default 1.5G)")
    p.add_argument("--explore", type=int, default=None, help="samples per engine and bucket (default 1)")
    p.add_argument("--refresh", type=int, default=None, help="refresh interval in transfers (default never)")
    p.add_argument("--repeat", type=int, default=None, help="timings per engine and transfer (default 3)")
    p.add_argument("--seed", type=int, default=None, help="workload seed (default 1)")
    p.add_argument("--json", action="store_true", help="print the raw JSON report")


def _cmd(args: argparse.Namespace) -> int:
    report = run(args.dir, sizes=args.sizes, iterations=args.iterations, min_size=args.min_size,
                 max_size=args.max_size, budget=args.budget, explore=args.explore,
                 refresh=args.refresh, repeat=args.repeat, seed=args.seed)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
    return 0


def run(directory: str | os.PathLike[str], **options: Any) -> dict[str, Any]:
    """Run the hit-rate workload in ``directory`` through ``go run ./cmd/dicthitrate``.

    The page cache is dropped first when running as root.

    Args:
        directory: where the workload file is made and removed.
        **options: ``sizes``, ``iterations``, ``min_size``, ``max_size``,
            ``budget``, ``explore``, ``refresh``, ``repeat``, ``seed``
            (numbers; sizes in bytes), ``write``, ``read`` (comma-separated
            engines); None or absent means the program's default.

    Returns:
        The report: workload, per-strategy ``results`` (``hit_rate`` is
        oracle time / chosen time, ``oracle_choice`` the fraction of
        transfers where the choice was the oracle's), per-bucket detail and
        the dictionaries built.

    Raises:
        RuntimeError: Go is not on the PATH, or the program failed (its message).
    """
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("benchmarks dict runs `go run ./cmd/dicthitrate`: Go is not on the PATH")
    cmd = [go, "run", "./cmd/dicthitrate", "-dir", os.path.abspath(directory)]
    for name, value in options.items():
        if value is not None:
            cmd += [f"-{name.replace('_', '-')}", str(value)]
    if os.geteuid() == 0:
        cmd.append("-drop-caches")
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        why = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        raise RuntimeError(f"go run ./cmd/dicthitrate: {why[0]}")
    return json.loads(proc.stdout)


def format_report(r: dict[str, Any]) -> str:
    """Format a hit-rate report as text."""
    mib = 1 << 20
    lines = [
        f"dir {r['dir']} ({r['fs_type']}); write engines {', '.join(r['write_engines'])}; "
        f"read engines {', '.join(r['read_engines'])}",
        f"workload: {len(r['sizes'])} sizes from {r['sizes'][0] / 1024:.1f} KiB to "
        f"{r['sizes'][-1] / mib:.1f} MiB x {r['iterations']} iterations = {r['transfers']} writes + "
        f"{r['transfers']} reads, {r['bytes'] / mib:.0f} MiB each way; explore {r['explore']}, "
        f"refresh {r['refresh'] or 'never'}; measured in {r['measure_seconds']:.1f} s"
        + ("" if r["dropped_caches"] else " (page cache not dropped first: not root)"),
    ]
    for name, why in sorted((r.get("excluded") or {}).items()):
        lines.append(f"  not a candidate: {name}: {why}")
    lines.append("")
    lines.append(f"  {'strategy':<12} {'direction':<24} {'transfers':>9} {'chosen s':>9} {'oracle s':>9} "
                 f"{'hit rate':>9} {'oracle choice':>14}")
    for x in r["results"]:
        lines.append(f"  {x['strategy']:<12} {x['direction']:<24} {x['transfers']:>9} "
                     f"{x['chosen_seconds']:>9.3f} {x['oracle_seconds']:>9.3f} {x['hit_rate']:>9.1%} "
                     f"{x['oracle_choice']:>14.1%}")
    lines.append("")
    lines.append("  per bucket (aware): direction size transfers oracle's usual engine, "
                 "dictionary's final choice, hit rate")
    for b in r["buckets"]:
        lines.append(f"    {b['direction']:<5} {b['size']:>5} {b['transfers']:>4}  {b['oracle']:<7} "
                     f"{b['chosen']:<7} {b['hit_rate']:.1%}")
    aware = {x["direction"]: x for x in r["results"] if x["strategy"] == "aware"}
    sep, wr = aware["write+read (separate)"], aware["write_read (WRDic)"]
    lines.append("")
    lines.append(f"hit rate (aware dictionaries): {sep['hit_rate']:.1%} with WDic/RDic, "
                 f"{wr['hit_rate']:.1%} with WRDic; oracle's choice on {sep['oracle_choice']:.1%} "
                 f"and {wr['oracle_choice']:.1%} of transfers (target {TARGET:.0%}: "
                 f"{'met' if min(sep['hit_rate'], wr['hit_rate']) >= TARGET else 'not met'})")
    return "\n".join(lines)
