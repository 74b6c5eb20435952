"""Write this torch's fixtures for tests/test_torch_versions.py: the same state saved by
``torch.save`` and by ``pyfastensor.save`` under the running torch.

Run once per torch version kept here (with that torch installed, from the repository's root):
``python tests/data/torch_versions/make.py``. It writes ``torch-<version>.pt`` and
``pyfastensor-<version>.pt`` beside itself.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def state() -> dict:
    """What every fixture holds: dtypes every supported torch saves, a view, a shared storage,
    a Parameter, an empty tensor, a non-contiguous one and plain Python values."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return {
        "model": collections.OrderedDict(
            weight=torch.nn.Parameter(torch.linspace(-1, 1, 12).reshape(3, 4)),
            bias=torch.arange(3, dtype=torch.float64),
        ),
        "bf16": torch.arange(8, dtype=torch.float32).to(torch.bfloat16),
        "f16": torch.arange(8, dtype=torch.float16) / 3,
        "i64": torch.arange(-5, 5, dtype=torch.int64),
        "u8": torch.arange(16, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "c64": torch.complex(torch.arange(3.0), -torch.arange(3.0)),
        "base": base,
        "row": base[1],  # a view: shares base's storage
        "t": base.t(),  # non-contiguous
        "empty": torch.zeros(0),
        "step": 7,
        "name": "fixture",
    }


def main() -> None:
    sys.path.insert(0, str(HERE.parents[2]))
    import pyfastensor

    version = torch.__version__.split("+")[0]
    torch.save(state(), HERE / f"torch-{version}.pt")
    pyfastensor.save(state(), HERE / f"pyfastensor-{version}.pt")
    print(f"wrote torch-{version}.pt and pyfastensor-{version}.pt")


if __name__ == "__main__":
    main()
