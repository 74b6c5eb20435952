"""pyfastensor.data: pack, verify and ChunkDataset over a small class-sorted dataset.

Every delivered sample is checked against its source file; exactly once per
epoch under any request order; resume in a new process; damaged and
mismatched packs, tiny budgets, each error's
message checked.
"""

from __future__ import annotations

import itertools
import json
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from data_helpers import CHUNK, CLASSES, PER_CLASS, digest, keep, serve

from pyfastensor import _lib
from pyfastensor.data import ChunkDataset, pack, verify
from pyfastensor.errors import (
    CorruptFileError,
    InvalidArgumentError,
    NotFoundError,
    UnsupportedError,
)

ROOT = Path(__file__).resolve().parents[1]
N = len(CLASSES) * PER_CLASS




@pytest.fixture(scope="module")
def min_budget(packed) -> int:
    with ChunkDataset(packed, memory_budget=1 << 30) as ds:
        return ds.layout["min_budget"]


@pytest.fixture(scope="module")
def small(min_budget) -> int:
    """A budget giving several abstract chunks of several chunks each (1 < G < chunks): the
    default overflow share (0.9) leaves the slots and reads 1.5 times the pack's minimum."""
    return min_budget * 15


@pytest.fixture
def copy(packed, tmp_path) -> Path:
    """A copy of the pack, to damage."""
    return Path(shutil.copytree(packed, tmp_path / "copy"))


def _perm(seed: int) -> list[int]:
    order = list(range(N))
    random.Random(seed).shuffle(order)
    return order


def test_pack_verify_round_trip(source, packed):
    src, files = source
    s = verify(packed, progress=False)
    assert (s["samples"], s["chunks"], s["chunk_size"], s["classes"]) == (N, -(-N // CHUNK), CHUNK, list(CLASSES))
    assert s["data_bytes"] == sum(len(b) for b in files)
    with ChunkDataset(packed, memory_budget=1 << 30, with_index=True) as ds:
        assert len(ds) == N and ds.classes == list(CLASSES)
        dl = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True, collate_fn=keep)
        seen_files, seen_pos = set(), set()
        for batch in dl:
            for data, label, index in batch:
                assert data.dtype == torch.uint8 and data.dim() == 1
                rel, want = files[data.numpy().tobytes()]  # KeyError: bytes that are no file's
                assert label == want, f"{rel}: label {label}, its class is {want}"
                seen_files.add(rel)
                seen_pos.add(index)
    assert len(seen_files) == N and seen_pos == set(range(N))


def test_pack_again_keeps_every_chunk(source, packed, tmp_path):
    out = tmp_path / "again"
    first = pack(source[0], out, chunk_size=CHUNK, seed=7, progress=False)
    again = pack(source[0], out, chunk_size=CHUNK, seed=7, progress=False)
    assert (first["chunks_written"], again["chunks_kept"], again["resumed"]) == (first["chunks"], first["chunks"], True)
    assert [p.read_bytes() for p in sorted(out.iterdir())] == [p.read_bytes() for p in sorted(packed.iterdir())]


def test_getitems_fetches_a_batch_in_one_native_call(packed, monkeypatch):
    from pyfastensor.data import _native

    calls = []
    get = _native.Server.get
    monkeypatch.setattr(_native.Server, "get", lambda self, idx: calls.append(len(idx)) or get(self, idx))
    monkeypatch.setattr(ChunkDataset, "__getitem__", lambda self, i: pytest.fail("DataLoader fetched one by one"))
    with ChunkDataset(packed, memory_budget=1 << 30) as ds:
        n = sum(len(b) for b in torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, collate_fn=keep))
    assert n == N and calls == [64, 64, 64, 64, N - 256]


@pytest.mark.parametrize("order", ["random", "sorted"])
def test_exactly_once_per_epoch(packed, small, order):
    with ChunkDataset(packed, memory_budget=small, with_index=True) as ds:
        assert 1 < ds.layout["chunks_per_group"] < ds.layout["chunks"]
        for epoch in range(2):
            ds.set_epoch(epoch)
            if order == "random":
                g = torch.Generator().manual_seed(epoch)
                sampler = torch.utils.data.RandomSampler(ds, generator=g)
            else:
                sampler = torch.utils.data.SequentialSampler(ds)
            got = serve(ds, list(sampler))
            assert sorted(p for p, _, _ in got) == list(range(N))
            assert len({d for _, _, d in got}) == N
            assert ds.stats()["served"] == N


def test_epochs_differ_and_repeat(packed, small):
    order = _perm(1)
    with ChunkDataset(packed, memory_budget=small, with_index=True) as ds:
        e0 = serve(ds, order)
        ds.set_epoch(1)
        e1 = serve(ds, order)
    with ChunkDataset(packed, memory_budget=small, with_index=True) as again:
        assert serve(again, order) == e0  # a function of (seed, epoch, requests)
    assert sorted(e0) == sorted(e1) and e0 != e1
    moved = sum(a[0] != b[0] for a, b in zip(e0, e1, strict=True))
    assert moved > N // 2, f"epochs 0 and 1 differ in only {moved} of {N} places"


CHILD = """
import json, sys
sys.path.insert(0, {tests!r})
from data_helpers import serve
from pyfastensor.data import ChunkDataset

args = json.load(open(sys.argv[1]))
ds = ChunkDataset(args["pack"], memory_budget=args["budget"], seed=12345, with_index=True)
ds.load_state_dict(args["state"])
out = {{"rest": serve(ds, args["rest"])}}
try:
    ds[0]
except Exception as e:
    out["after"] = type(e).__name__ + ": " + str(e)
ds.set_epoch(args["epoch"] + 1)
out["next"] = serve(ds, args["order"])
print(json.dumps(out))
"""


@pytest.mark.parametrize("cut", ["mid", "boundary-1", "boundary"])
def test_resume_in_a_new_process(packed, small, tmp_path, cut):
    """A state taken after ``k`` requests, loaded into a new dataset in a new
    process: the rest of the permutation delivers exactly the samples not yet
    delivered, the very ones the first dataset would have; the next epoch follows."""
    epoch, order = 3, _perm(2)
    k = {"mid": N // 2 + 5, "boundary-1": N - 1, "boundary": N}[cut]
    with ChunkDataset(packed, memory_budget=small, seed=9, with_index=True) as ref:
        ref.set_epoch(epoch)
        whole = serve(ref, order)
        ref.set_epoch(epoch + 1)
        following = serve(ref, order)
    with ChunkDataset(packed, memory_budget=small, seed=9, with_index=True) as ds:
        ds.set_epoch(epoch)
        first = serve(ds, order[:k])
        state = ds.state_dict()
    assert state["served"] == k and state["epoch"] == epoch
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"pack": str(packed), "budget": small, "state": state, "epoch": epoch,
                                "rest": order[k:], "order": order}))
    out = subprocess.run([sys.executable, "-c", CHILD.format(tests=str(ROOT / "tests")), str(args)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    child = json.loads(out.stdout)
    rest = [tuple(x) for x in child["rest"]]
    assert len(rest) == N - k
    assert first + rest == whole
    assert sorted(p for p, _, _ in first + rest) == list(range(N))
    assert "epoch complete" in child["after"] and f"set_epoch({epoch + 1})" in child["after"]
    assert child["after"].startswith("InvalidArgumentError: ")
    assert [tuple(x) for x in child["next"]] == following


def _through_sampler(ds: ChunkDataset, batches: int | None = None) -> list[tuple[int, int, str]]:
    """Serve ``ds.sampler()``'s order through a DataLoader (num_workers=0), stopping after
    ``batches`` batches (None: all); return the samples as :func:`data_helpers.serve` does."""
    dl = torch.utils.data.DataLoader(ds, batch_size=32, sampler=ds.sampler(), collate_fn=keep)
    # islice: a for loop that breaks would have fetched one batch more
    return [(int(i), int(label), digest(data)) for batch in itertools.islice(dl, batches) for data, label, i in batch]


@pytest.mark.parametrize("batches", [0, 4, -(-N // 32)])
def test_sampler_resumes_after_load_state_dict(packed, small, batches):
    """ChunkDataset.sampler() on one node: a state taken after ``batches`` batches, loaded into a
    new dataset, makes a DataLoader over its sampler deliver exactly the rest of the epoch, the
    very samples the uninterrupted loader delivered; the next epoch asks for every position."""
    epoch = 3
    with ChunkDataset(packed, memory_budget=small, seed=9, with_index=True) as ref:
        ref.set_epoch(epoch)
        whole = _through_sampler(ref)
    assert sorted(p for p, _, _ in whole) == list(range(N))
    with ChunkDataset(packed, memory_budget=small, seed=9, with_index=True) as ds:
        ds.set_epoch(epoch)
        first = _through_sampler(ds, batches)
        state = ds.state_dict()
    assert state["served"] == len(first) == min(N, 32 * batches)
    with ChunkDataset(packed, memory_budget=small, seed=12345, with_index=True) as ds:
        ds.load_state_dict(state)
        assert len(ds.sampler()) == N - len(first)
        rest = _through_sampler(ds)
        assert first + rest == whole
        ds.set_epoch(epoch + 1)
        assert len(ds.sampler()) == N
        assert sorted(p for p, _, _ in _through_sampler(ds)) == list(range(N))


def test_state_dict_of_another_pack_or_layout(packed, small, source, tmp_path):
    other = tmp_path / "other"
    pack(source[0], other, chunk_size=CHUNK, seed=8, progress=False)
    with ChunkDataset(packed, memory_budget=small) as ds:
        ds[0]
        state = ds.state_dict()
    with ChunkDataset(other, memory_budget=small) as ds, pytest.raises(InvalidArgumentError, match="the state is of pack"):
        ds.load_state_dict(state)
    with ChunkDataset(packed, memory_budget=1 << 30) as ds:
        with pytest.raises(InvalidArgumentError, match=r"groups \d+ chunks per abstract chunk, this server's budget of 1073741824 bytes gives 1"):
            ds.load_state_dict(state)
        with pytest.raises(TypeError, match="expected a mapping"):
            ds.load_state_dict([1, 2])


def test_damaged_chunk_names_file_and_sample(copy):
    chunk = copy / "chunk-3.bin"
    b = bytearray(chunk.read_bytes())
    b[5] ^= 0xFF  # inside the chunk's first sample: position 3*16
    chunk.write_bytes(bytes(b))
    with pytest.raises(CorruptFileError, match=rf"{chunk}.* is corrupt: sample {3 * CHUNK} at offset 0: .* CRC-32"):
        verify(copy, progress=False)
    with ChunkDataset(copy, memory_budget=1 << 30) as ds:  # G = 1: request i gets sample i
        with pytest.raises(CorruptFileError, match=rf"{chunk} is corrupt: sample {3 * CHUNK} at offset 0"):
            serve_plain(ds, list(range(N)))
        assert ds.stats()["served"] >= 3 * CHUNK


def serve_plain(ds: ChunkDataset, order: list[int]) -> None:
    for _ in torch.utils.data.DataLoader(ds, batch_size=CHUNK, sampler=order, collate_fn=keep):
        pass


def test_chunk_not_matching_the_index(copy):
    chunk = copy / "chunk-2.bin"
    with open(chunk, "ab") as f:
        f.write(bytes(4096))
    with pytest.raises(CorruptFileError, match=rf"{chunk} is corrupt: \d+ bytes where the index says \d+"):
        ChunkDataset(copy, memory_budget=1 << 30)[0]
    with pytest.raises(CorruptFileError, match=rf"{chunk} is corrupt"):
        verify(copy, progress=False)


def test_chunks_swapped(copy):
    sizes: dict[int, list[int]] = {}
    for c in range(-(-N // CHUNK)):
        sizes.setdefault((copy / f"chunk-{c}.bin").stat().st_size, []).append(c)
    a, b = next(cs for cs in sizes.values() if len(cs) > 1)[:2]
    pa, pb = copy / f"chunk-{a}.bin", copy / f"chunk-{b}.bin"
    da, db = pa.read_bytes(), pb.read_bytes()
    pa.write_bytes(db)
    pb.write_bytes(da)
    with pytest.raises(CorruptFileError, match=rf"{pa} is corrupt: sample {a * CHUNK} at offset 0"):
        verify(copy, progress=False)


def test_damaged_index(copy):
    index = copy / "index.pfi"
    b = bytearray(index.read_bytes())
    b[len(b) // 2] ^= 1
    index.write_bytes(bytes(b))
    with pytest.raises(CorruptFileError, match=rf"{index} is corrupt: .*index CRC-32"):
        ChunkDataset(copy, memory_budget=1 << 30)[0]


def test_newer_format_version(copy):
    index = copy / "index.pfi"
    b = bytearray(index.read_bytes())
    b[8:12] = (2).to_bytes(4, "little")
    index.write_bytes(bytes(b))
    msg = rf"{index} is pack format version 2; this build reads versions up to 1 \(upgrade pyfastensor"
    with pytest.raises(UnsupportedError, match=msg):
        len(ChunkDataset(copy, memory_budget=1 << 30))
    with pytest.raises(UnsupportedError, match=msg):
        verify(copy, progress=False)


def test_budget_below_the_minimum(packed, min_budget):
    with pytest.raises(InvalidArgumentError, match=rf"a budget of 1000 bytes is below the {min_budget} bytes this pack needs"):
        ChunkDataset(packed, memory_budget=1000)[0]
    with pytest.raises(InvalidArgumentError, match=r"memory_budget=0: expected a positive number of bytes"):
        ChunkDataset(packed, memory_budget=0)
    with ChunkDataset(packed, memory_budget=min_budget) as ds:
        assert ds.layout["abstract_chunks"] == 1
    with ChunkDataset(packed, memory_budget="1G") as ds:
        assert ds.layout["budget"] == 1 << 30


def test_requests_not_a_permutation(packed):
    with ChunkDataset(packed, memory_budget=1 << 30) as ds:  # G = 1: one sample per slot
        ds[0]
        with pytest.raises(InvalidArgumentError, match="not a permutation of the pack's positions: position 0: slot 0"):
            ds[0]
        with pytest.raises(InvalidArgumentError, match="not a permutation"):
            ds.__getitems__([1, 1])
        assert ds.stats()["served"] == 1  # the refused batch served nothing
        with pytest.raises(IndexError, match=f"index {N} is outside"):
            ds[N]


@pytest.mark.parametrize("factor", [1.0, 1.5, 4.0])
def test_memory_peak_within_budget(packed, min_budget, factor):
    budget = int(min_budget * factor)
    with ChunkDataset(packed, memory_budget=budget, with_index=True) as ds:
        got = serve(ds, _perm(4))
        st = ds.stats()
    assert sorted(p for p, _, _ in got) == list(range(N))
    assert 0 < st["peak_bytes"] <= budget == st["budget"]
    assert st["served"] == N and st["held_bytes"] == 0 and st["in_flight_bytes"] == 0
    assert st["bytes_read"] >= verify(packed, progress=False)["file_bytes"]


def test_lifetime(packed):
    before = _lib.handle_count() if _lib.loaded() else 0
    ds = ChunkDataset(packed, memory_budget=1 << 30, with_index=True)
    assert ds._server is not None and _lib.handle_count() == before + 1  # opened by the constructor
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._server is None and copy._address() != ds._address()  # its own, on first use
    data, label, index = ds[5]
    cdata, clabel, cindex = copy[5]  # a server of its own, at the same state: the same sample
    assert (clabel, cindex) == (label, index) and torch.equal(cdata, data)
    assert _lib.handle_count() == before + 2
    ds.close()
    copy.close()
    assert _lib.handle_count() == before
    with pytest.raises(ValueError, match="is closed"):
        ds[0]
    ds.close()  # idempotent


def test_transform_and_items(packed, source):
    files = source[1]
    with ChunkDataset(packed, memory_budget=1 << 30, transform=lambda t: t.numpy().tobytes()) as ds:
        data, label = ds[7]
        assert files[data][1] == label


def test_not_a_directory(tmp_path):
    with pytest.raises(NotFoundError, match="no such directory"):
        ChunkDataset(tmp_path / "missing", memory_budget=1 << 20)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CorruptFileError, match=rf"{empty / 'index.pfi'} is corrupt: no index"):
        len(ChunkDataset(empty, memory_budget=1 << 20))
    with pytest.raises(NotFoundError, match="no such directory"):
        pack(tmp_path / "missing", tmp_path / "o", chunk_size=4)


def test_pack_refuses_foreign_files(source, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(InvalidArgumentError, match=r"notes.txt in .* is not a file of a pack"):
        pack(source[0], out, chunk_size=CHUNK, progress=False)
    assert os.listdir(out) == ["notes.txt"]


def _manifest(path: Path, rels: list[str], labels: list[str]) -> Path:
    path.write_text("".join(f"{rel} {label}\n" for rel, label in zip(rels, labels, strict=True)), encoding="utf-8")
    return path


def test_manifest_integer_label_not_a_class_index(source, tmp_path):
    """When every label is an integer they are class indices: one negative ("-1", unlabelled) or
    one of 2**24 (loader MaxClasses) or more is refused, naming the line, the label and the fix,
    instead of making every label a name or a class list as long as the label."""
    src, files = source
    rels = sorted(rel for rel, _ in files.values())[:4]
    out = tmp_path / "out"
    for line, bad in ((4, "-1"), (2, str(1 << 24)), (3, "1" + "0" * 30)):
        labels = ["0", "2", "10", "1"]
        labels[line - 1] = bad
        manifest = _manifest(tmp_path / "ints.txt", rels, labels)
        with pytest.raises(InvalidArgumentError, match=(
                rf"^{re.escape(str(manifest))}:{line}: label '{bad}' is not a class index: when every label "
                r"is an integer, labels are class indices 0 to N-1 \(N at most 16777216\); give the classes "
                r"names instead \(labels that are not integers\), which are indexed in sorted order$")):
            pack(src, out, chunk_size=4, manifest=manifest, progress=False)
    assert not out.exists()  # refused before packing


def test_manifest_labels_not_ascii_integers_are_names(source, tmp_path):
    """A label is an integer only if it is ASCII ``-?[0-9]+``: "²" and "٣" (digits to
    str.isdigit()) are names, and so, with any name among them, are integer labels ("-1" too)."""
    src, files = source
    rels = sorted(rel for rel, _ in files.values())[:4]
    by_rel = {rel: data for data, (rel, _) in files.items()}
    for labels, classes in ((["0", "\u00b2", "1", "\u0663"], ["0", "1", "\u00b2", "\u0663"]),
                            (["-1", "cat", "0", "10"], ["-1", "0", "10", "cat"]),
                            (["0", "10", "0", "2"], [str(i) for i in range(11)])):
        manifest = _manifest(tmp_path / "labels.txt", rels, labels)
        out = tmp_path / "out"
        assert pack(src, out, chunk_size=4, manifest=manifest, progress=False)["classes"] == classes
        with ChunkDataset(out, memory_budget=1 << 30) as ds:
            got: dict[bytes, str] = {}
            for i in range(len(ds)):
                data, label = ds[i]
                got[data.numpy().tobytes()] = ds.classes[label]
        assert got == {by_rel[rel]: label for rel, label in zip(rels, labels, strict=True)}
        shutil.rmtree(out)


def test_overflow_share(packed, min_budget):
    """A read's samples for occupied slots, kept in the overflow share, are not read again."""
    budget = min_budget * 2
    reads = {}
    for overflow in (0, None):  # the paper's policy; the default share
        with ChunkDataset(packed, memory_budget=budget, with_index=True, overflow=overflow) as ds:
            got = serve(ds, _perm(11))
            st, layout = ds.stats(), ds.layout
        assert sorted(p for p, _, _ in got) == list(range(N))
        assert st["peak_bytes"] <= budget
        # the default share (0.9 of the budget) shrinks to leave the slots and reads their least
        assert layout["overflow_bytes"] == (0 if overflow == 0 else budget - min_budget)
        reads[overflow] = st["chunk_reads"]
    assert reads[None] < reads[0] / 2, reads
    with pytest.raises(InvalidArgumentError, match=r"overflow=1\.5: expected a share of the budget from 0 to 0\.9"):
        ChunkDataset(packed, memory_budget=budget, overflow=1.5)


def test_folder_samples_skip_hidden_folders_unentered_and_symlink_loops(tmp_path):
    """Files are listed as torchvision's sorted walk lists them; folders whose names start with
    '.' are not entered, and a link to a folder containing it (a loop os.walk would follow
    without end) is not followed; a link elsewhere is."""
    from pyfastensor.data.pack import folder_samples

    src = tmp_path / "src"
    for rel in ("cat/a", "cat/sub/b", "cat/sub-x/e", "cat/.git/objects/x", "dog/c", "dog/.hidden"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(b"x")
    want = [(p, c) for c, name in enumerate(("cat", "dog"))
            for root, _, files in sorted(os.walk(src / name, followlinks=True))
            if ".git" not in root for p in (os.path.join(root, f) for f in sorted(files))
            if not os.path.basename(p).startswith(".")]
    assert folder_samples(src) == (want, ["cat", "dog"])
    (src / "cat" / "sub" / "loop").symlink_to(src / "cat")
    (src / "cat" / "dogs").symlink_to(src / "dog")
    samples, _ = folder_samples(src)
    assert [(os.path.relpath(p, src), c) for p, c in samples] == [
        ("cat/a", 0), ("cat/dogs/c", 0), ("cat/sub/b", 0), ("cat/sub-x/e", 0), ("dog/c", 1)]
