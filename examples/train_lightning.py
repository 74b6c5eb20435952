"""Train a small transformer with Lightning on a packed token dataset, kill it, resume it exactly.

The run, end to end:

1. A token corpus (a synthetic Markov chain, ``--vocab`` tokens) is cut into
   sequences of ``--seq-len + 1`` tokens (sequence packing), one file each,
   and packed into chunks (``pyfastensor.data.pack``).
2. A small causal transformer is trained on it with a Lightning ``Trainer``
   (on the CPU, or one GPU with ``--accelerator cuda``): data through ``pyfastensor.data.ChunkDataset`` and torchdata's
   ``StatefulDataLoader`` with ``--workers`` workers, the saved activations
   offloaded to a spill file (``pyfastensor.offload``), a checkpoint every
   ``--checkpoint-every`` steps through ``pyfastensor.lightning.CheckpointIO``
   (Lightning puts the loader's ``state_dict()`` in it).
3. The same training runs three more times, each in a process of its own:
   uninterrupted (the reference); killed with SIGKILL at step
   ``--kill-at-step`` and restarted from its last checkpoint; and with stock
   torch (a plain ``Dataset`` over the files, torch's ``DataLoader``,
   ``torch.save`` checkpoints through Lightning's default, no offload).
4. It checks that the killed-and-resumed run ends with the reference's
   weights, bit for bit (every parameter's bytes), and that the steps of its
   final trajectory (those before the checkpoint it resumed from, then the
   resumed ones) consumed every sample exactly once per epoch; and prints the
   time per step, the checkpoint stall and the peak memory of pyfastensor's
   run against stock torch's.

Run ``python examples/train_lightning.py`` (about a minute on 2 CPU cores);
``--help`` lists the size knobs. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

SPILL_MIN_SIZE = 64 << 10  # saved tensors from 64 KiB go to the spill file


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Train a small transformer with Lightning on a packed token dataset (ChunkDataset + "
                    "StatefulDataLoader, activation offload, pyfastensor checkpoints), kill it mid-epoch with "
                    "SIGKILL, resume it from its last checkpoint, check it ends with the uninterrupted run's "
                    "weights bit for bit and every sample once per epoch, and compare time per step, checkpoint "
                    "stall and peak memory with stock torch.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    size = p.add_argument_group("size")
    size.add_argument("--samples", type=int, default=512, help="sequences in the dataset")
    size.add_argument("--seq-len", type=int, default=64, help="tokens per training sequence")
    size.add_argument("--vocab", type=int, default=256, help="vocabulary size (at most 32768)")
    size.add_argument("--d-model", type=int, default=128, help="the transformer's width")
    size.add_argument("--layers", type=int, default=2, help="transformer layers")
    size.add_argument("--heads", type=int, default=4, help="attention heads")
    size.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    size.add_argument("--epochs", type=int, default=2, help="epochs to train")
    size.add_argument("--chunk-size", type=int, default=16, help="samples per chunk of the pack")
    run = p.add_argument_group("run")
    run.add_argument("--checkpoint-every", type=int, default=8, help="steps between checkpoints")
    run.add_argument("--kill-at-step", type=int, default=None,
                     help="the step the killed run is killed at (before it runs); None: the middle of the last "
                          "epoch, between two checkpoints")
    run.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    run.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1),
                     help="torch threads of each training process")
    run.add_argument("--seed", type=int, default=0, help="the seed of the model, the corpus and the shuffle")
    run.add_argument("--accelerator", default="cpu", choices=("cpu", "cuda"),
                     help="where the model trains (cuda: one GPU, deterministic algorithms; the saved "
                          "activations are offloaded from the GPU)")
    run.add_argument("--no-stock", action="store_true", help="skip the stock torch run (no comparison)")
    run.add_argument("--workdir", type=Path, default=None,
                     help="where the corpus, pack, checkpoints and logs go; None: a temporary directory, "
                          "removed at the end")
    run.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    # A training process of the run (the example starts them itself).
    p.add_argument("--role", default="drive", choices=("drive", "train"), help=argparse.SUPPRESS)
    p.add_argument("--mode", default="pyfastensor", choices=("pyfastensor", "stock"), help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--resume", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--pause-at-step", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--budget", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not 2 <= args.vocab <= 32768:
        p.error("--vocab: from 2 to 32768")
    for name in ("samples", "seq_len", "d_model", "layers", "heads", "batch_size", "epochs", "chunk_size",
                 "checkpoint_every", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: at least 1")
    if args.d_model % args.heads:
        p.error("--d-model: a multiple of --heads")
    if args.accelerator == "cuda" and not torch.cuda.is_available():
        p.error("--accelerator cuda: no CUDA device here (torch.cuda.is_available() is False)")
    return args


def steps_per_epoch(args: argparse.Namespace) -> int:
    return -(-args.samples // args.batch_size)


# The data: a packed token corpus.


def make_corpus(args: argparse.Namespace, root: Path) -> list[Path]:
    """One file per training sequence (``seq_len + 1`` int16 tokens) cut from one token stream."""
    g = torch.Generator().manual_seed(args.seed)
    n = args.samples * (args.seq_len + 1)
    # A Markov chain: each token follows from the one before and one of 4 steps, so there is
    # something to learn.
    steps = torch.tensor([1, 3, 7, 11])[torch.randint(0, 4, (n,), generator=g)]
    stream = torch.empty(n, dtype=torch.int64)
    stream[0] = 0
    for k in range(1, n):
        stream[k] = (stream[k - 1] * 5 + steps[k]) % args.vocab
    folder = root / "corpus" / "tokens"  # one class: the pack's label is 0 for every sample
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, block in enumerate(stream.view(args.samples, args.seq_len + 1).to(torch.int16)):
        path = folder / f"{i:06d}.bin"
        path.write_bytes(block.numpy().tobytes())
        paths.append(path)
    return paths


def decode(data: torch.Tensor) -> torch.Tensor:
    """A sample's bytes as its tokens (int64)."""
    return data.view(torch.int16).to(torch.int64)


class TokenFiles(torch.utils.data.Dataset):
    """The stock path: one file read per sample. Items are ``(tokens, label, index)`` as ChunkDataset's."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = [str(p) for p in paths]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        with open(self.paths[i], "rb") as f:
            data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
        return decode(data), 0, i


# A training process.


def train(args: argparse.Namespace) -> int:
    import lightning.pytorch as pl
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO as LightningIO
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torchdata.stateful_dataloader import StatefulDataLoader

    import pyfastensor
    from pyfastensor.data import ChunkDataset
    from pyfastensor.lightning import CheckpointIO

    torch.set_num_threads(args.threads)
    if args.accelerator == "cuda":  # deterministic cuBLAS (Lightning's deterministic=True asks for it)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    root, out = args.workdir, args.out
    out.mkdir(parents=True, exist_ok=True)
    fast = args.mode == "pyfastensor"

    class TimedIO(LightningIO):
        """The run's CheckpointIO, timing each save: the training loop waits for it."""

        def __init__(self, inner: LightningIO) -> None:
            self.inner, self.seconds = inner, []

        def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
            t = time.perf_counter()
            self.inner.save_checkpoint(checkpoint, path, storage_options)
            self.seconds.append(time.perf_counter() - t)

        def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None) -> Any:
            return self.inner.load_checkpoint(path, map_location=map_location, weights_only=weights_only)

        def remove_checkpoint(self, path: Any) -> None:
            self.inner.remove_checkpoint(path)

    class TinyLM(pl.LightningModule):
        """A causal transformer LM; each step's forward and backward inside the offload context."""

        def __init__(self, dataset: Any, offload: Any) -> None:
            super().__init__()
            self.automatic_optimization = False  # the step is ours: the offload context wraps backward too
            d = args.d_model
            self.embed = torch.nn.Embedding(args.vocab, d)
            self.pos = torch.nn.Parameter(torch.randn(args.seq_len, d) * 0.02)
            layer = torch.nn.TransformerEncoderLayer(d, args.heads, 4 * d, dropout=0.0, batch_first=True,
                                                     norm_first=True)
            self.blocks = torch.nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
            self.head = torch.nn.Linear(d, args.vocab)
            self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(args.seq_len),
                                 persistent=False)
            self.dataset, self.offload = dataset, offload
            self.step_starts: list[float] = []
            self.saved_bytes: int | None = None  # stock: counted in the first step
            self.log_file = open(out / "steps.jsonl", "a")  # noqa: SIM115 - open for the whole run

        def loss(self, tokens: torch.Tensor) -> torch.Tensor:
            x, y = tokens[:, :-1], tokens[:, 1:]
            h = self.blocks(self.embed(x) + self.pos, mask=self.mask, is_causal=True)
            return torch.nn.functional.cross_entropy(self.head(h).flatten(0, 1), y.flatten())

        def on_train_epoch_start(self) -> None:
            # Lightning makes the epoch's iterator after this hook, except for the first epoch
            # (made before it) and an epoch resumed mid-way (the loader's state sets the epoch).
            if fast and self.dataset.stats()["epoch"] != self.current_epoch:
                self.dataset.set_epoch(self.current_epoch)

        def training_step(self, batch: Any, batch_idx: int) -> None:
            step = self.global_step
            if step == args.pause_at_step:
                print(f"PAUSED {step}", flush=True)  # the example kills this process now
                while True:
                    time.sleep(60)
            self.step_starts.append(time.perf_counter())
            tokens, _, ids = batch
            opt = self.optimizers()
            if self.offload is not None:
                with self.offload:
                    loss = self.loss(tokens)
                    self.manual_backward(loss)
            elif self.saved_bytes is None:
                # Stock: the bytes of the activations saved for backward, counted once (in the first
                # step, which is not timed): the storages offload would take (not the parameters').
                params = {p.untyped_storage().data_ptr() for p in self.parameters()}
                storages: dict[int, int] = {}

                def pack(t: torch.Tensor) -> torch.Tensor:
                    storage = t.untyped_storage()
                    if storage.data_ptr() not in params and storage.nbytes() >= SPILL_MIN_SIZE:
                        storages[storage.data_ptr()] = storage.nbytes()
                    return t

                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    loss = self.loss(tokens)
                self.manual_backward(loss)
                self.saved_bytes = sum(storages.values())
            else:
                loss = self.loss(tokens)
                self.manual_backward(loss)
            opt.step()
            opt.zero_grad(set_to_none=True)
            self.log_file.write(json.dumps({"epoch": self.current_epoch, "step": step,
                                            "ids": [int(i) for i in ids], "loss": float(loss)}) + "\n")
            self.log_file.flush()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=3e-3)

    if fast:
        dataset = ChunkDataset(root / "packed", memory_budget=args.budget, seed=args.seed, with_index=True,
                               transform=decode)
        loader = StatefulDataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                                    generator=torch.Generator().manual_seed(args.seed))
        io = TimedIO(CheckpointIO())
    else:
        dataset = TokenFiles(sorted((root / "corpus" / "tokens").iterdir()))
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                             num_workers=args.workers,
                                             generator=torch.Generator().manual_seed(args.seed))
        io = TimedIO(TorchCheckpointIO())

    torch.manual_seed(args.seed)
    model = TinyLM(dataset, None)
    offload = None
    if fast:  # the model's parameters and buffers stay in memory
        (root / "spill").mkdir(exist_ok=True)
        offload = model.offload = pyfastensor.offload(spill_dir=str(root / "spill"), min_size=SPILL_MIN_SIZE,
                                                      module=model)
    checkpoints = ModelCheckpoint(dirpath=out / "checkpoints", filename="latest", every_n_train_steps=args.checkpoint_every,
                                  save_top_k=1, enable_version_counter=False)
    trainer = pl.Trainer(default_root_dir=out, accelerator=args.accelerator, devices=1, max_epochs=args.epochs,
                         plugins=[io], callbacks=[checkpoints], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, deterministic=True, num_sanity_val_steps=0,
                         limit_val_batches=0)
    t0 = time.perf_counter()
    trainer.fit(model, train_dataloaders=loader, ckpt_path=str(args.resume) if args.resume else None)
    seconds = time.perf_counter() - t0
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out / "weights.pt")
    intervals = [b - a for a, b in zip(model.step_starts, model.step_starts[1:], strict=False)][1:]
    summary = offload.summary() if offload is not None else None
    metrics = {
        "mode": args.mode, "steps": len(model.step_starts), "seconds": seconds,
        "step_median_s": statistics.median(intervals) if intervals else None,
        "step_mean_s": statistics.fmean(intervals) if intervals else None,
        "checkpoints": len(io.seconds), "checkpoint_total_s": sum(io.seconds),
        "checkpoint_mean_s": statistics.fmean(io.seconds) if io.seconds else None,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "activations_peak_bytes": summary.resident_peak_bytes if summary is not None else model.saved_bytes or 0,
        "offloaded_bytes": summary.raw_bytes_offloaded if summary is not None else 0,
        "checkpoint_bytes": (out / "checkpoints" / "latest.ckpt").stat().st_size
        if (out / "checkpoints" / "latest.ckpt").exists() else None,
    }
    (out / "metrics.json").write_text(json.dumps(metrics))
    if offload is not None:
        offload.close()
    if fast:
        dataset.close()
    return 0


# The driver.


def child(args: argparse.Namespace, mode: str, out: Path, **extra: Any) -> list[str]:
    cmd = [sys.executable, os.path.abspath(__file__), "--role", "train", "--mode", mode, "--out", str(out),
           "--workdir", str(args.workdir), "--budget", str(args.budget)]
    for name in ("samples", "seq_len", "vocab", "d_model", "layers", "heads", "batch_size", "epochs", "chunk_size",
                 "checkpoint_every", "workers", "threads", "seed", "accelerator"):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    for name, value in extra.items():
        cmd += [f"--{name.replace('_', '-')}", str(value)]
    return cmd


def run_child(cmd: list[str], out: Path, log_name: str = "log.txt") -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / log_name, "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {rc}:\n{(out / log_name).read_text()[-4000:]}")
    return json.loads((out / "metrics.json").read_text())


def run_killed(cmd: list[str], out: Path) -> int:
    """Run until the child says it reached its pause step, then SIGKILL it; return its exit status."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if line.startswith("PAUSED"):
                proc.send_signal(signal.SIGKILL)
                break
        rc = proc.wait()
        proc.stdout.close()
    if rc != -signal.SIGKILL:
        raise RuntimeError(f"the run to kill exited {rc} before its step:\n{(out / 'log.txt').read_text()[-4000:]}")
    return rc


def steps(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def same_weights(a: Path, b: Path) -> tuple[bool, int, int]:
    """Whether every tensor of two state dicts has the same bytes; the tensors and bytes compared."""
    wa, wb = (torch.load(p, weights_only=True, map_location="cpu") for p in (a, b))
    same = wa.keys() == wb.keys()
    nbytes = 0
    for k in wa:
        x, y = wa[k].contiguous(), wb.get(k)
        nbytes += x.numel() * x.element_size()
        same = same and y is not None and x.dtype == y.dtype and x.shape == y.shape and \
            x.view(torch.uint8).equal(y.contiguous().view(torch.uint8))
    return same, len(wa), nbytes


def drive(args: argparse.Namespace) -> int:
    import pyfastensor.data

    per_epoch = steps_per_epoch(args)
    total = per_epoch * args.epochs
    kill = args.kill_at_step
    if kill is None:
        kill = (args.epochs - 1) * per_epoch + per_epoch // 2
        if kill % args.checkpoint_every == 0:
            kill += 1
    if not 0 < kill < total:
        raise SystemExit(f"--kill-at-step {kill}: from 1 to {total - 1} (the run has {total} steps)")
    if kill < args.checkpoint_every:
        raise SystemExit(f"--kill-at-step {kill}: after the first checkpoint (step {args.checkpoint_every})")
    temp = args.workdir is None
    args.workdir = Path(tempfile.mkdtemp(prefix="pyfastensor-example-")) if temp else args.workdir.resolve()
    root = args.workdir
    try:
        t0 = time.perf_counter()
        make_corpus(args, root)
        if (root / "packed").exists():
            shutil.rmtree(root / "packed")
        pyfastensor.data.pack(root / "corpus", root / "packed", chunk_size=args.chunk_size, seed=args.seed,
                              progress=False)
        with pyfastensor.data.ChunkDataset(root / "packed", memory_budget=1 << 40) as ds:
            # A quarter of the data, at least the pack's minimum.
            data = args.samples * (args.seq_len + 1) * 2
            args.budget = max(ds.layout["min_budget"], data // 4)
        print(f"corpus: {args.samples} sequences of {args.seq_len + 1} tokens, packed in chunks of "
              f"{args.chunk_size} ({time.perf_counter() - t0:.1f} s); {args.epochs} epochs of {per_epoch} steps, "
              f"a checkpoint every {args.checkpoint_every} steps, {args.workers} workers", flush=True)
        for d in ("reference", "killed", "stock"):
            shutil.rmtree(root / d, ignore_errors=True)

        ref = run_child(child(args, "pyfastensor", root / "reference"), root / "reference")
        print(f"uninterrupted run: {ref['steps']} steps in {ref['seconds']:.1f} s", flush=True)

        killed = root / "killed"
        rc = run_killed(child(args, "pyfastensor", killed, pause_at_step=kill), killed)
        ckpt = killed / "checkpoints" / "latest.ckpt"
        resumed_from = int(torch.load(ckpt, weights_only=False, map_location="cpu")["global_step"])
        before = [s for s in steps(killed / "steps.jsonl") if s["step"] < resumed_from]
        print(f"killed run: SIGKILL at step {kill} (exit {rc}); its last checkpoint is of step {resumed_from}",
              flush=True)
        resumed = run_child(child(args, "pyfastensor", killed, resume=ckpt), killed, "log-resumed.txt")
        after = [s for s in steps(killed / "steps.jsonl") if s["step"] >= resumed_from]
        # steps.jsonl holds both processes' steps; those of the killed one past its checkpoint
        # were trained on again after the resume: the final trajectory's are the last of each step.
        final = {s["step"]: s for s in before}
        for s in after:
            final[s["step"]] = s
        trajectory = [final[k] for k in sorted(final)]
        print(f"resumed run: steps {resumed_from} to {total - 1} in {resumed['seconds']:.1f} s", flush=True)

        same, tensors, nbytes = same_weights(root / "reference" / "weights.pt", killed / "weights.pt")
        epochs_once = []
        for e in range(args.epochs):
            ids = sorted(i for s in trajectory if s["epoch"] == e for i in s["ids"])
            epochs_once.append(ids == list(range(args.samples)))
        reference_steps = steps(root / "reference" / "steps.jsonl")
        same_batches = [s["ids"] for s in trajectory] == [s["ids"] for s in reference_steps]
        complete = [s["step"] for s in trajectory] == list(range(total))

        stock = None if args.no_stock else run_child(child(args, "stock", root / "stock"), root / "stock")

        ok = same and all(epochs_once) and complete
        print()
        print(f"weights after kill and resume vs uninterrupted: "
              f"{'bit-identical' if same else 'DIFFERENT'} ({tensors} tensors, {nbytes:,} bytes compared)")
        print("every sample once per epoch (final trajectory): "
              + ", ".join(f"epoch {e}: {'yes' if o else 'NO'}" for e, o in enumerate(epochs_once))
              + f"; the same batches as uninterrupted: {'yes' if same_batches else 'no'}")
        print()
        rows = [("", "pyfastensor", "stock torch")]

        def fmt(m: dict[str, Any] | None, key: str, scale: float, unit: str) -> str:
            if m is None or m.get(key) is None:
                return "-"
            return f"{m[key] * scale:,.1f} {unit}"

        for label, key, scale, unit in (("time per step (median)", "step_median_s", 1e3, "ms"),
                                        ("time per step (mean)", "step_mean_s", 1e3, "ms"),
                                        ("checkpoint stall (mean)", "checkpoint_mean_s", 1e3, "ms"),
                                        ("checkpoint stall (total)", "checkpoint_total_s", 1e3, "ms"),
                                        ("peak memory (RSS)", "peak_rss_bytes", 1 / 2**20, "MiB"),
                                        ("saved activations in memory (peak)", "activations_peak_bytes",
                                         1 / 2**20, "MiB")):
            rows.append((label, fmt(ref, key, scale, unit), fmt(stock, key, scale, unit)))
        rows.append(("checkpoints written", str(ref["checkpoints"]), str(stock["checkpoints"]) if stock else "-"))
        width = [max(len(r[c]) for r in rows) for c in range(3)]
        for r in rows:
            print(f"{r[0]:<{width[0]}}  {r[1]:>{width[1]}}  {r[2]:>{width[2]}}")
        print(f"(uninterrupted runs, {args.threads} torch threads each; pyfastensor: ChunkDataset + "
              f"StatefulDataLoader, offload of {ref['offloaded_bytes'] / 2**20:,.1f} MiB per step, durable "
              f"checkpoints (fsync) of {(ref['checkpoint_bytes'] or 0) / 2**20:,.1f} MiB; stock: files + DataLoader, "
              "torch.save checkpoints without fsync, no offload)")
        result = {"ok": ok, "bit_identical": same, "tensors": tensors, "bytes": nbytes, "exactly_once": epochs_once,
                  "same_batches": same_batches, "complete": complete, "killed_at": kill, "kill_status": rc,
                  "resumed_from": resumed_from, "steps": total, "pyfastensor": ref, "resumed": resumed,
                  "stock": stock}
        if args.json is not None:
            args.json.write_text(json.dumps(result, indent=1))
        return 0 if ok else 1
    finally:
        if temp:
            shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "train":
        return train(args)
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
