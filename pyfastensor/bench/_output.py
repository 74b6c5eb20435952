"""What every benchmark writes besides its report: the raw results as JSON, and its plot."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_json(result: Any, path: str | Path, *, what: str = "raw results") -> Path:
    """Write ``result`` as indented JSON at ``path`` (its directory made if needed; values JSON
    does not know, numpy's floats among them, as floats) and say where."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=float))
    print(f"{what}: {out}")
    return out


def save_figure(fig: Any, path: str | Path, *, dpi: int = 110) -> Path:
    """Save a matplotlib figure at ``path``, its directory made if needed; return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    return out


def plot_or_say(plot: Callable[[Any, str], Path], result: Any, path: str) -> None:
    """Draw ``plot(result, path)`` and say where, or say why not where matplotlib is missing."""
    try:
        print(f"plot: {plot(result, path)}")
    except ImportError:
        print("plot: skipped, matplotlib is not installed (pip install 'pyfastensor[plot]')")
