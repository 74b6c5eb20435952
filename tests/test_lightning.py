"""pyfastensor.lightning.CheckpointIO under a real Lightning Trainer (CPU, no mocks of Lightning)."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch", reason="needs lightning (tests/requirements.txt)")
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.plugins.io import AsyncCheckpointIO  # noqa: E402

import pyfastensor  # noqa: E402
from pyfastensor import CorruptFileError  # noqa: E402
from pyfastensor.lightning import CheckpointIO  # noqa: E402

BATCHES = 4  # per epoch


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)  # state per parameter: saved and restored


def loader() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCHES * 8, 16, generator=g)
    y = x.sum(1, keepdim=True)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def trainer(root, *, plugins=None, callbacks=None, epochs: int = 1) -> pl.Trainer:
    return pl.Trainer(default_root_dir=root, accelerator="cpu", devices=1, max_epochs=epochs,
                      plugins=plugins or [], callbacks=callbacks or [], logger=False,
                      enable_progress_bar=False, enable_model_summary=False, deterministic=True)


def fresh_model() -> Regression:
    torch.manual_seed(1)
    return Regression()


def pyfastensor_layout(path) -> bool:
    """Whether every storage record of the zip at ``path`` starts on 4 KiB, as pyfastensor writes them."""
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        records = [i for i in z.infolist() if "/data/" in i.filename]
        assert records, f"{path} has no storage records"
        for info in records:
            f.seek(info.header_offset)
            h = f.read(30)
            start = info.header_offset + 30 + int.from_bytes(h[26:28], "little") + int.from_bytes(h[28:30], "little")
            if start % 4096:
                return False
    return True


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_top_k_and_last_are_written_and_removed_through_pyfastensor(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="train_loss", save_top_k=2, save_last=True,
                           every_n_train_steps=1)
    model = fresh_model()
    trainer(tmp_path, plugins=[CheckpointIO()], callbacks=[ckpt], epochs=2).fit(model, loader())

    files = sorted(p.name for p in (tmp_path / "ck").iterdir())
    # 8 steps saved one top-k file each; all but the best two were removed again.
    assert len(files) == 3 and "last.ckpt" in files, files
    assert not [p for p in (tmp_path / "ck").iterdir() if ".pyfastensor-tmp" in p.name]
    for name in files:
        path = tmp_path / "ck" / name
        assert pyfastensor_layout(path), name
        stock = torch.load(path, weights_only=False)  # stock torch reads every file
        assert {"state_dict", "optimizer_states", "loops", "callbacks", "global_step"} <= stock.keys()
    last = torch.load(tmp_path / "ck" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 2 * BATCHES
    assert_same_state(last["state_dict"], model.state_dict())


def test_resume_ends_with_the_weights_of_an_uninterrupted_run(tmp_path):
    whole = fresh_model()
    trainer(tmp_path / "whole", epochs=2).fit(whole, loader())

    first = fresh_model()
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)
    trainer(tmp_path / "a", plugins=[CheckpointIO()], callbacks=[ckpt], epochs=1).fit(first, loader())
    resumed = Regression()  # other initial weights: everything must come from the checkpoint
    trainer(tmp_path / "b", plugins=[CheckpointIO()], epochs=2).fit(
        resumed, loader(), ckpt_path=tmp_path / "ck" / "last.ckpt")

    assert_same_state(resumed.state_dict(), whole.state_dict())


def test_checkpoints_of_stock_lightning_load_through_it(tmp_path):
    model = fresh_model()
    t = trainer(tmp_path, epochs=1)  # Lightning's own TorchCheckpointIO
    t.fit(model, loader())
    path = tmp_path / "stock.ckpt"
    t.save_checkpoint(path)
    assert not pyfastensor_layout(path)  # torch.save's file, not ours

    got = CheckpointIO().load_checkpoint(path)
    assert_same_state(got["state_dict"], model.state_dict())
    resumed = Regression()
    trainer(tmp_path / "b", plugins=[CheckpointIO()], epochs=2).fit(resumed, loader(), ckpt_path=path)
    assert resumed.trainer.global_step == 2 * BATCHES


def test_async_checkpoint_io_wraps_it(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True, every_n_train_steps=2)
    model = fresh_model()
    trainer(tmp_path, plugins=[AsyncCheckpointIO(CheckpointIO())], callbacks=[ckpt], epochs=1).fit(
        model, loader())
    last = tmp_path / "ck" / "last.ckpt"
    assert pyfastensor_layout(last)
    assert_same_state(pyfastensor.load(last, weights_only=False)["state_dict"], model.state_dict())


def test_a_flipped_byte_fails_the_resume_naming_the_file(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)
    trainer(tmp_path, plugins=[CheckpointIO()], callbacks=[ckpt], epochs=1).fit(fresh_model(), loader())
    path = tmp_path / "ck" / "last.ckpt"
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
    with open(path, "r+b") as f:
        f.seek(info.header_offset)
        h = f.read(30)
        at = info.header_offset + 30 + int.from_bytes(h[26:28], "little") + int.from_bytes(h[28:30], "little")
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x01]))

    with pytest.raises(CorruptFileError) as e:
        trainer(tmp_path / "b", plugins=[CheckpointIO()], epochs=2).fit(Regression(), loader(), ckpt_path=path)
    assert str(path) in str(e.value) and "CRC-32" in str(e.value)


def test_remote_urls_and_storage_options_are_refused_by_name(tmp_path):
    io = CheckpointIO()
    with pytest.raises(ValueError, match=r"s3://bucket/x\.ckpt"):
        io.save_checkpoint({"w": torch.ones(2)}, "s3://bucket/x.ckpt")
    with pytest.raises(TypeError, match="storage_options"):
        io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "x.ckpt", storage_options={"a": 1})
    with pytest.raises(FileNotFoundError, match="missing.ckpt"):
        io.load_checkpoint(tmp_path / "missing.ckpt")
    io.remove_checkpoint(tmp_path / "missing.ckpt")  # nothing there: no error, as Lightning's own


def test_options_reach_save_and_load(tmp_path):
    io = CheckpointIO(durable=False, verify=False, engine="posix")
    path = tmp_path / "sub" / "x.ckpt"
    io.save_checkpoint({"w": torch.arange(10.0)}, path)
    assert torch.equal(io.load_checkpoint(path)["w"], torch.arange(10.0))
    io.remove_checkpoint(path)
    assert not path.exists()


def test_importing_pyfastensor_does_not_import_lightning():
    code = ("import sys, pyfastensor; pyfastensor.save; pyfastensor.load; "
            "assert not [m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')]")
    subprocess.run([sys.executable, "-c", code], check=True)
