"""Checkpoints of PyTorch Lightning through pyfastensor: ``pyfastensor.lightning.CheckpointIO``.

Lightning asks one plugin, its ``CheckpointIO``, to write, read and remove
every checkpoint it makes (model, optimizers, loops, callbacks, hyper-
parameters). This one does it with :func:`pyfastensor.save` and
:func:`pyfastensor.load`::

    import lightning.pytorch as pl
    from pyfastensor.lightning import CheckpointIO

    trainer = pl.Trainer(plugins=[CheckpointIO()])

The files are PyTorch's own format (stock :func:`torch.load` and Lightning's
``TorchCheckpointIO`` read them), and files ``TorchCheckpointIO`` wrote load
through this plugin. Importing :mod:`pyfastensor` does not import Lightning;
this module does (``pip install lightning``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO as _LightningCheckpointIO
except ImportError as e:  # pragma: no cover - exercised only where lightning is missing
    raise ImportError(
        "pyfastensor.lightning needs PyTorch Lightning: pip install lightning "
        f"(or pip install 'pyfastensor[lightning]'); importing it failed: {e}"
    ) from e

from .dictionary import Dictionaries

__all__ = ["CheckpointIO"]


def _local_path(path: str | os.PathLike[str], action: str) -> Path:
    """``path`` as a local path; a URL (``s3://``, ``gs://``, ``http://``...) is refused by name."""
    text = os.fspath(path)
    if "://" in text and not text.startswith("file://"):
        raise ValueError(
            f"pyfastensor.lightning.CheckpointIO cannot {action} {text}: it works on local "
            "files (a path, or file://); use Lightning's TorchCheckpointIO for remote storage"
        )
    return Path(text.removeprefix("file://"))


def _keep_storage(storage: Any, location: str) -> Any:
    return storage


class CheckpointIO(_LightningCheckpointIO):
    """A Lightning ``CheckpointIO`` that saves with :func:`pyfastensor.save` and loads with :func:`pyfastensor.load`.

    Every checkpoint Lightning writes (``ModelCheckpoint``, ``trainer.save_checkpoint``)
    is saved durably (a temporary file beside the target, fsync, rename,
    fsync of the directory: after a crash the path holds the old checkpoint
    or the new one), each storage record with its CRC-32; every load checks
    the CRC-32s and names the file and record of a mismatch
    (:class:`~pyfastensor.CorruptFileError`). Wrap it in Lightning's
    ``AsyncCheckpointIO`` to save in a background thread.

    Args:
        durable: fsync each checkpoint and its directory before the save
            returns. Default: ``True``.
        verify: check every record's CRC-32 on load. Default: ``True``.
        engine: the I/O engine for every record (``"posix"``, ``"direct"``...),
            or open :class:`pyfastensor.dictionary.Dictionaries`, as
            :func:`pyfastensor.save` takes it. Default: pyfastensor's choice.
    """

    def __init__(
        self,
        *,
        durable: bool = True,
        verify: bool = True,
        engine: str | Dictionaries | None = None,
    ) -> None:
        super().__init__()
        self.durable = durable
        self.verify = verify
        self.engine = engine

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: str | os.PathLike[str],
        storage_options: Any | None = None,
    ) -> None:
        """Save Lightning's checkpoint dict to ``path`` with :func:`pyfastensor.save`.

        Args:
            checkpoint: the dict Lightning built (model, optimizers, loops, callbacks).
            path: the file to write; its directory is created if missing.
            storage_options: not supported (as with Lightning's ``TorchCheckpointIO``).

        Raises:
            TypeError: ``storage_options`` was given.
            ValueError: ``path`` is a remote URL.
            NoSpaceError: the filesystem is full; the previous file at ``path`` is intact.
        """
        from .checkpoint import save

        if storage_options is not None:
            raise TypeError(
                "`Trainer.save_checkpoint(..., storage_options=...)` is not supported by "
                "pyfastensor.lightning.CheckpointIO: it takes no storage options"
            )
        target = _local_path(path, "save to")
        target.parent.mkdir(parents=True, exist_ok=True)
        save(checkpoint, target, durable=self.durable, engine=self.engine)

    def load_checkpoint(
        self,
        path: str | os.PathLike[str],
        map_location: Callable[..., Any] | Any | None = _keep_storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Load a checkpoint with :func:`pyfastensor.load` (ours or one ``torch.save`` wrote).

        Args:
            path: the checkpoint file.
            map_location: where to put the storages, as in :func:`torch.load`.
                Default: where they were saved from (Lightning's default).
            weights_only: as in :func:`torch.load`. Default: ``None``, torch's
                default (``True``: only tensors, plain types and allowlisted
                globals; a checkpoint holding other objects, such as
                hyper-parameters of custom classes, needs ``False`` or
                ``torch.serialization.add_safe_globals``, as with stock Lightning).

        Returns:
            The checkpoint dict.

        Raises:
            FileNotFoundError: no file at ``path``.
            CorruptFileError: a record's CRC-32 or the file's structure is
                wrong; the message names the file and the record.
        """
        from .checkpoint import load

        source = _local_path(path, "load")
        if not source.exists():
            raise FileNotFoundError(f"Checkpoint file not found: {source}")
        return load(source, map_location=map_location, weights_only=weights_only,
                    verify=self.verify, engine=self.engine)

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Remove a checkpoint (a file, or a directory of one) if it exists.

        Args:
            path: what :meth:`save_checkpoint` wrote.
        """
        target = _local_path(path, "remove")
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
