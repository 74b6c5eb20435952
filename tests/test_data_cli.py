"""``python -m pyfastensor data pack`` and ``data verify``: exit codes, messages, manifests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from data_helpers import CHUNK, CLASSES, PER_CLASS

from pyfastensor.data import ChunkDataset

ROOT = Path(__file__).resolve().parents[1]
N = len(CLASSES) * PER_CLASS


def _cli(*args: object, progress: bool = False) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYFASTENSOR_PROGRESS="1" if progress else "0")
    return subprocess.run([sys.executable, "-m", "pyfastensor", "data", *map(str, args)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)



def test_pack_then_verify(source, tmp_path):
    out = tmp_path / "pack"
    r = _cli("pack", source[0], out, "--chunk-size", CHUNK, "--seed", 3, progress=True)
    assert r.returncode == 0, r.stderr
    chunks = -(-N // CHUNK)
    assert r.stdout.startswith(f"packed {out}: {N} samples of 3 classes in {chunks} chunks: ")
    assert f"({chunks} written; " in r.stdout and len(r.stdout.splitlines()) == 1
    assert f"{N}/{N}" in r.stderr  # the progress bar, finished
    r = _cli("verify", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"OK: {out}: {N} samples of 3 classes in {chunks} chunks of {CHUNK}, ")
    assert "every CRC-32 matches" in r.stdout and len(r.stdout.splitlines()) == 1
    r = _cli("pack", source[0], out, "--chunk-size", CHUNK, "--seed", 3)
    assert r.returncode == 0 and f"(0 written, {chunks} kept (already there, byte for byte); " in r.stdout


def test_verify_names_the_damaged_chunk_and_sample(source, tmp_path):
    out = tmp_path / "pack"
    assert _cli("pack", source[0], out, "--chunk-size", CHUNK, "--seed", 3).returncode == 0
    chunk = out / "chunk-5.bin"
    b = bytearray(chunk.read_bytes())
    b[3] ^= 0x40
    chunk.write_bytes(bytes(b))
    r = _cli("verify", out)
    assert r.returncode == 1
    assert r.stdout.startswith(f"CORRUPT: loader: {chunk} is corrupt: sample {5 * CHUNK} at offset 0: ")
    (out / "index.pfi").unlink()
    r = _cli("verify", out)
    assert r.returncode == 1
    assert f"CORRUPT: loader: {out / 'index.pfi'} is corrupt: no index: not a pack, or one whose packing did not finish" in r.stdout


def test_verify_missing_directory(tmp_path):
    r = _cli("verify", tmp_path / "nope")
    assert r.returncode == 1
    assert f"pyfastensor: error: [Errno 2] {tmp_path / 'nope'}: no such directory" in r.stderr


def test_pack_with_a_manifest(source, tmp_path):
    src, files = source
    spaced = tmp_path / "with space.bin"
    spaced.write_bytes(b"a file whose name has a space")
    lines = ["# path label", ""]
    picked: dict[bytes, str] = {}
    for data, (rel, label) in list(files.items())[::3]:
        name = ["zebra", "yak"][label % 2]  # names, not numbers: sorted, yak is 0
        lines.append(f"{rel} {name}")
        picked[data] = name
    lines.append(f"{spaced}\tzebra")  # an absolute path, a tab
    picked[b"a file whose name has a space"] = "zebra"
    manifest = tmp_path / "list.txt"
    manifest.write_text("\n".join(lines) + "\n")
    out = tmp_path / "pack"
    r = _cli("pack", src, out, "--chunk-size", 8, "--seed", 1, "--manifest", manifest)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"packed {out}: {len(picked)} samples of 2 classes in ")
    with ChunkDataset(out, memory_budget=1 << 30) as ds:
        assert ds.classes == ["yak", "zebra"] and len(ds) == len(picked)
        got: dict[bytes, str] = {}
        for i in range(len(ds)):
            data, label = ds[i]
            got[data.numpy().tobytes()] = ds.classes[label]
    assert got == picked


def test_manifest_integer_labels_and_bad_lines(source, tmp_path):
    src, files = source
    rels = sorted(rel for rel, _ in files.values())[:20]
    manifest = tmp_path / "ints.txt"
    manifest.write_text("".join(f"{rel} {i % 4 * 2}\n" for i, rel in enumerate(rels)))
    out = tmp_path / "pack"
    r = _cli("pack", src, out, "--chunk-size", 4, "--seed", 0, "--manifest", manifest)
    assert r.returncode == 0, r.stderr
    with ChunkDataset(out, memory_budget=1 << 30) as ds:
        assert ds.classes == [str(i) for i in range(7)]  # labels 0, 2, 4, 6 as given
        assert sorted(ds[i][1] for i in range(len(ds))) == sorted(i % 4 * 2 for i in range(20))

    bad = tmp_path / "bad.txt"
    bad.write_text(f"{rels[0]} 0\n\nonlyapath\n")
    r = _cli("pack", src, tmp_path / "p2", "--chunk-size", 4, "--seed", 0, "--manifest", bad)
    assert r.returncode == 1
    assert f"pyfastensor: error: {bad}:3: 'onlyapath' is not 'path label'" in r.stderr
    missing = tmp_path / "missing.txt"
    missing.write_text("nope.bin 0\n")
    r = _cli("pack", src, tmp_path / "p3", "--chunk-size", 4, "--seed", 0, "--manifest", missing)
    assert r.returncode == 1
    assert "sample 0: " in r.stderr and str(src / "nope.bin") in r.stderr and "no such file" in r.stderr.lower()


def test_pack_usage_errors(source, tmp_path):
    r = _cli("pack", source[0], tmp_path / "o", "--seed", 1)
    assert r.returncode == 2 and "the following arguments are required: --chunk-size" in r.stderr
    r = _cli("pack", source[0], tmp_path / "o", "--chunk-size", 0, "--seed", 1)
    assert r.returncode == 1 and "chunk_size=0: expected an integer >= 1" in r.stderr
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "keep.me").write_text("")
    r = _cli("pack", source[0], tmp_path / "o", "--chunk-size", 4, "--seed", 1)
    assert r.returncode == 1 and "keep.me in" in r.stderr and "is not a file of a pack" in r.stderr


def test_help_answers_what_each_option_does():
    r = subprocess.run([sys.executable, "-m", "pyfastensor", "data", "pack", "--help"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    for words in ("samples per chunk file", "seed of the shuffle", "one 'path label' per line",
                  "ImageFolder-layout folder", "created if missing"):
        assert words in text, words
