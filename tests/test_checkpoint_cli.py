"""``python -m pyfastensor ckpt``: what it says of files it cannot list or check."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import pyfastensor
from pyfastensor.checkpoint_cli import UNCHECKED
from pyfastensor.cli import main


class Thing:
    """A class the weights-only unpickler refuses."""

    def __init__(self) -> None:
        self.t = torch.ones(2)


def test_a_legacy_file_has_nothing_to_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(3)}, path, _use_new_zipfile_serialization=False)
    assert main(["ckpt", "verify", str(path)]) == UNCHECKED
    out = capsys.readouterr().out
    assert out.startswith(f"UNCHECKED: {path}: torch's legacy format") and "CORRUPT" not in out
    assert main(["ckpt", "ls", str(path)]) == 0
    assert "no records or CRC-32s to list or check" in capsys.readouterr().out
    assert torch.equal(pyfastensor.load(path)["w"], torch.ones(3)), "it is readable, as the message says"


def test_keys_of_a_file_the_weights_only_unpickler_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "custom.pt"
    torch.save({"w": torch.ones(3), "thing": Thing()}, path)
    assert main(["ckpt", "ls", "--keys", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: the weights-only unpickler refuses it" in err and "--unsafe" in err
    assert main(["ckpt", "ls", "--keys", "--unsafe", str(path)]) == 0
    out = capsys.readouterr().out
    assert "  w: (3,) torch.float32" in out and "  thing: Thing" in out


def test_a_damaged_file_is_an_error_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.pt"
    path.write_bytes(b"PK\x03\x04garbage")
    assert main(["ckpt", "ls", str(path)]) == 1
    assert capsys.readouterr().err.startswith(f"pyfastensor: error: checkpoint: {path} is corrupt")
    assert main(["ckpt", "verify", str(path)]) == 1
    assert capsys.readouterr().out.startswith(f"CORRUPT: checkpoint: {path} is corrupt")


def test_verify_reads_the_records_where_the_file_is_mapped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ok.pt"
    pyfastensor.save({"w": torch.arange(1 << 20, dtype=torch.float32)}, path)
    assert main(["ckpt", "verify", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"OK: {path}: ")
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # inside the tensor's record
    path.write_bytes(bytes(raw))
    assert main(["ckpt", "verify", str(path)]) == 1
    assert "CORRUPT" in capsys.readouterr().out
