"""Packing a dataset into chunk files, and checking a pack: :func:`pack` and :func:`verify`.

Python lists the samples (an ImageFolder-layout folder, or a manifest) and
shows the progress bar; the Go core (``loader/pack.go``, ``loader/verify.go``)
shuffles, writes and checks. Nothing here imports torch.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .. import config, errors
from . import _native

T = TypeVar("T")

Sample = tuple[str, int]  # (absolute path, label)

# The Go side's bound on the class table (loader/format.go MaxClasses): an
# integer label is an index into it, so it is below this.
MAX_CLASSES = 1 << 24

# An integer label: ASCII digits only (str.isdigit() also takes "²", which int() refuses).
_INT_LABEL = re.compile(r"-?[0-9]+")


def folder_samples(src: str | os.PathLike[str]) -> tuple[list[Sample], list[str]]:
    """The samples of an ImageFolder-layout folder: ``SRC/<class>/**/<file>``.

    Classes are the subfolders of ``src``, sorted by name; a sample's label is
    its class's index. Files are listed as torchvision's ``ImageFolder`` lists
    them (sorted walk, symlinks followed), without its extension filter: every
    regular file is a sample, but names starting with ``.`` (files and folders,
    which are not entered) are skipped, a symbolic link to a folder that
    contains it (a loop) is not followed, and files directly in ``src`` belong
    to no class and are not packed.

    Args:
        src: the folder.

    Returns:
        The samples as (absolute path, label), class by class, and the class names.

    Raises:
        NotFoundError: ``src`` is not a directory.
        InvalidArgumentError: ``src`` has no class subfolder, or no file in any.
    """
    root = Path(os.path.abspath(src))
    if not root.is_dir():
        raise errors.NotFoundError(f"{src}: no such directory (the folder to pack)")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise errors.InvalidArgumentError(
            f"{src} has no class subfolders: the ImageFolder layout is SRC/<class>/<file> "
            "(pass --manifest FILE, or manifest=, for other layouts)")
    samples: list[Sample] = []
    for label, name in enumerate(classes):
        for dirpath, filenames in _walk(root / name):
            for f in sorted(filenames):
                path = os.path.join(dirpath, f)
                if not f.startswith(".") and os.path.isfile(path):
                    samples.append((path, label))
    if not samples:
        raise errors.InvalidArgumentError(f"{src}: no files in its {len(classes)} class subfolders")
    return samples, classes


def _walk(top: Path) -> list[tuple[str, list[str]]]:
    """``(folder, file names)`` of ``top`` and the folders below it, sorted by path as
    torchvision's ``sorted(os.walk(top, followlinks=True))``, without the folders whose names
    start with ``.`` (not entered at all) and without entering a symbolic link to a folder
    that contains it (a loop, which ``os.walk`` would follow without end)."""
    out: list[tuple[str, list[str]]] = []
    above: dict[str, frozenset[tuple[int, int]]] = {}  # a folder -> its own and its ancestors' (dev, inode)
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        st = os.stat(dirpath)
        chain = above.pop(dirpath, frozenset()) | {(st.st_dev, st.st_ino)}
        keep = []
        for d in dirnames:
            if d.startswith("."):
                continue
            try:
                sub = os.stat(os.path.join(dirpath, d))
            except OSError:
                continue  # a dangling link, or gone meanwhile: os.walk would not list it either
            if (sub.st_dev, sub.st_ino) not in chain:
                keep.append(d)
                above[os.path.join(dirpath, d)] = chain
        dirnames[:] = keep
        out.append((dirpath, filenames))
    return sorted(out)


def manifest_samples(
    manifest: str | os.PathLike[str], root: str | os.PathLike[str]
) -> tuple[list[Sample], list[str]]:
    """The samples a manifest lists: one ``path label`` per line.

    The label is the last whitespace-separated field (so paths may hold
    spaces); blank lines and lines starting with ``#`` are skipped. Relative
    paths are resolved against ``root``. A label is an integer if it is ASCII
    ``-?[0-9]+``. When every label is an integer, each is a class index,
    ``0 <= label < MAX_CLASSES`` (``2**24``), kept as it is, and the classes
    are ``"0"`` to the largest; otherwise (any label not an integer) labels
    are class names, and a sample's label is its name's index among the
    sorted distinct names.

    Args:
        manifest: the manifest file.
        root: the folder relative paths are resolved against (SRC).

    Returns:
        The samples as (absolute path, label), in the manifest's order, and the class names.

    Raises:
        NotFoundError: the manifest does not exist.
        InvalidArgumentError: a line without a label, or integer labels with one negative or
            ``>= MAX_CLASSES`` (naming the file and line), or no samples.
    """
    base = os.path.abspath(root)
    rows: list[tuple[str, str, int]] = []  # (absolute path, label, line number)
    try:
        text = Path(manifest).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise errors.NotFoundError(f"{manifest}: no such manifest file") from None
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        fields = s.rsplit(None, 1)
        if len(fields) != 2:
            raise errors.InvalidArgumentError(
                f"{manifest}:{n}: {line!r} is not 'path label' (a path, whitespace, then its label)")
        path, label = fields
        rows.append((os.path.join(base, path), label, n))
    if not rows:
        raise errors.InvalidArgumentError(f"{manifest}: no samples (one 'path label' per line)")
    if all(_INT_LABEL.fullmatch(label) for _, label, _ in rows):
        samples: list[Sample] = []
        for path, label, n in rows:
            i = int(label)
            # Checked before building "0".."max": one stray label must not make a huge class list.
            if not 0 <= i < MAX_CLASSES:
                raise errors.InvalidArgumentError(
                    f"{manifest}:{n}: label {label!r} is not a class index: when every label is an integer, "
                    f"labels are class indices 0 to N-1 (N at most {MAX_CLASSES}); give the classes names "
                    "instead (labels that are not integers), which are indexed in sorted order")
            samples.append((path, i))
        return samples, [str(i) for i in range(max(i for _, i in samples) + 1)]
    names = sorted({label for _, label, _ in rows})
    index = {name: i for i, name in enumerate(names)}
    return [(p, index[label]) for p, label, _ in rows], names


def pack(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    chunk_size: int,
    seed: int = 0,
    manifest: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Pack a dataset's files into chunk files in ``out``, for :class:`~pyfastensor.data.ChunkDataset`.

    The samples (:func:`folder_samples`, or :func:`manifest_samples` with
    ``manifest``) are shuffled with ``seed`` and cut into chunks of
    ``chunk_size``; each chunk is one file (``chunk-<n>.bin``), and an index
    (``index.pfi``) gives each sample's chunk, offset, length, label and
    CRC-32. The index is written last, durably: an interrupted pack leaves a
    directory that neither opens nor verifies, and running the same pack
    again resumes it (keeping the chunk files already written, byte for
    byte); another pack into the same directory restarts it. ``out`` may be
    missing, empty or hold a pack; anything else in it is refused.

    Args:
        src: an ImageFolder-layout folder (``SRC/<class>/<file>``), or the folder a
            manifest's relative paths are relative to.
        out: the pack's directory (created if missing).
        chunk_size: samples per chunk (the paper measured 64 best): 1 to 2**20.
        seed: the seed of the shuffle, 0 to 2**64-1. Default: 0.
        manifest: a file of ``path label`` lines to pack instead of ``src``'s folders.
        progress: show a progress bar; None follows ``PYFASTENSOR_PROGRESS``.

    Returns:
        The Go core's stats (``samples``, ``chunks``, ``chunks_written``,
        ``chunks_kept``, ``resumed``, ``data_bytes``, ``file_bytes``, ``seconds``, ...)
        and ``classes``, the class names.

    Raises:
        InvalidArgumentError: a bad chunk size or seed, no samples, a bad manifest
            line, or files in ``out`` that no pack wrote.
        NotFoundError: ``src``, the manifest or a sample file is missing (naming it).

    Example::

        >>> stats = pyfastensor.data.pack("imagenet/train", "packed", chunk_size=64, seed=0)
        >>> ds = pyfastensor.data.ChunkDataset("packed", memory_budget=8 << 30)
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise errors.InvalidArgumentError(f"chunk_size={chunk_size!r}: expected an integer >= 1")
    _check_seed(seed)
    if manifest is not None:
        samples, classes = manifest_samples(manifest, src)
    else:
        samples, classes = folder_samples(src)
    for path, _ in samples:
        _check_utf8(path)
    spec = {"samples": [{"path": p, "label": label} for p, label in samples],
            "classes": classes, "chunk_size": chunk_size, "seed": seed}
    stats = _with_bar(lambda counter: _native.pack(spec, out, counter),
                      desc=f"packing {os.fspath(out)}", unit=" samples", scale=False, progress=progress,
                      total=len(samples))
    stats["classes"] = classes
    return stats


def verify(out: str | os.PathLike[str], *, progress: bool | None = None) -> dict[str, Any]:
    """Check a pack: its index, and every chunk file's CRC-32 and each sample's.

    Args:
        out: the pack's directory.
        progress: show a progress bar; None follows ``PYFASTENSOR_PROGRESS``.

    Returns:
        The pack's summary: ``samples``, ``chunks``, ``chunk_size``, ``classes``,
        ``seed``, ``data_bytes``, ``file_bytes``, ``version``.

    Raises:
        CorruptFileError: the first damaged file, in chunk order: the message names
            the chunk file (or ``index.pfi``), and the sample and offset where known.
        UnsupportedError: the pack is of a newer format version than this build reads.
        NotFoundError: ``out`` is not a directory.

    Example::

        >>> pyfastensor.data.verify("packed")["samples"]
        1281167
    """
    if not os.path.isdir(out):
        raise errors.NotFoundError(f"{out}: no such directory (a pack's)")
    return _with_bar(lambda counter: _native.verify(out, counter),
                     desc=f"verifying {os.fspath(out)}", unit="B", scale=True, progress=progress)


def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 64:
        raise errors.InvalidArgumentError(f"seed={seed!r}: expected an integer from 0 to 2**64-1")


def _check_utf8(path: str) -> None:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise errors.InvalidArgumentError(
            f"{path!r}: the path is not UTF-8, which a pack's spec (JSON) cannot carry; rename it") from None


def _with_bar(
    fn: Callable[[Any], T], *, desc: str, unit: str, scale: bool, progress: bool | None, total: int | None = None
) -> T:
    """Call ``fn(counter)`` on a helper thread, showing a tqdm bar of the (done, total)
    pair the native call keeps in ``counter``; without a bar, call it here with None."""
    if not (config.progress_enabled() if progress is None else progress):
        return fn(None)
    counter = _native.Progress()
    result: list[T] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            result.append(fn(counter))
        except BaseException as e:  # re-raised on the caller's thread
            failure.append(e)

    t = threading.Thread(target=work, name="pyfastensor-pack", daemon=True)
    t.start()
    from tqdm.auto import tqdm

    with tqdm(total=total, desc=desc, unit=unit, unit_scale=scale, unit_divisor=1024 if scale else 1000) as bar:

        def show() -> None:
            if counter[1] and bar.total != counter[1]:
                bar.total = counter[1]
                bar.refresh()
            bar.update(counter[0] - bar.n)

        while t.is_alive():
            t.join(0.1)
            show()
        if not failure:
            show()
    if failure:
        raise failure[0]
    return result[0]


def summary_line(stats: dict[str, Any]) -> str:
    """One line about a finished :func:`pack` (the command line prints it)."""
    kept = f", {stats['chunks_kept']} kept (already there, byte for byte)" if stats.get("chunks_kept") else ""
    return (f"{stats['samples']} samples of {len(stats['classes'])} classes in {stats['chunks']} chunks: "
            f"{size_text(stats['data_bytes'])} of data, {size_text(stats['file_bytes'])} of chunk files "
            f"({stats['chunks_written']} written{kept}; {stats['seconds']:.2f} s)")


def size_text(n: float) -> str:
    """``n`` bytes in binary units: ``512 B``, ``1.5 MiB``."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            break
    return f"{n:.1f} {unit}"
