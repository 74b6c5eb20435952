"""``python -m benchmarks trainer``: a Hugging Face Trainer's checkpoints, routed through
pyfastensor against stock.

The model is GPT-2 small built from its config (124M fp32 parameters, no
download); one training step of AdamW gives the optimizer its state, so a
checkpoint holds what a real one holds: ``model.safetensors`` (498 MB),
``optimizer.pt`` (997 MB), the scheduler, the RNG states and the Trainer's
JSON. Each round runs two fresh processes, stock and routed
(``pyfastensor.route()`` before transformers is imported), in turn first,
each of which:

1. trains one step and lets the Trainer save its checkpoint
   (``save_steps=1``); **save** is the time the Trainer spends in it, from
   the end of the step (``on_step_end``) to ``on_save``: what stalls
   training. pyfastensor's saves are durable (fsync, rename); torch's and
   safetensors' leave the bytes in the page cache;
2. fsyncs every file of the checkpoint and its directory: **durable** is
   save plus that, the time until a crash cannot take the checkpoint;
3. drops the checkpoint's pages from the cache and resumes a fresh
   Trainer from it (``train(resume_from_checkpoint=...)`` with nothing left
   to train): **resume** is that call, the Trainer's own set-up included
   (the same in both), and the model's weights after it must equal the
   saved ones bit for bit.

Figures are seconds (medians of the rounds) and paired ratios stock /
routed per round, with their spread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .harness import (
    add_command,
    child_env,
    finish,
    paired_ratios,
    progress,
    round_order,
    spread_text,
    temp_dir,
)

MODES = ("stock", "routed")
_DESCRIPTION = __doc__


def child(out: str, mode: str, small: bool) -> dict[str, Any]:
    """One process of a round: train a step, save, make durable, resume cold (see the module)."""
    from benchmarks._child import reply_channel

    reply = reply_channel()
    import pyfastensor

    if mode == "routed":
        pyfastensor.route()
    import torch
    import transformers
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from pyfastensor.bench import disk

    transformers.logging.set_verbosity_error()
    config = GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=8192) if small else GPT2Config()
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, config.vocab_size, (4, 64),
                                                                       generator=torch.Generator().manual_seed(0))]
    marks: dict[str, float] = {}

    class Marks(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001, ANN003, ANN201
            marks["step_end"] = time.perf_counter()

        def on_save(self, args, state, control, **kw):  # noqa: ANN001, ANN003, ANN201
            marks["saved"] = time.perf_counter()

    def trainer(steps: int) -> Trainer:
        transformers.set_seed(0)
        args = TrainingArguments(output_dir=out, max_steps=steps, save_steps=1, per_device_train_batch_size=1,
                                 report_to=[], use_cpu=True, disable_tqdm=True, logging_steps=1000,
                                 save_safetensors=True)
        return Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=data, callbacks=[Marks()])

    first = trainer(1)
    first.train()
    save = marks["saved"] - marks["step_end"]
    saved = {k: v.clone() for k, v in first.model.state_dict().items()}
    ckpt = Path(out) / "checkpoint-1"
    files = sorted(p for p in ckpt.iterdir() if p.is_file())
    t = time.perf_counter()
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(ckpt, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    sync = time.perf_counter() - t
    del first
    disk.drop_caches(files)
    again = trainer(1)
    t = time.perf_counter()
    again.train(resume_from_checkpoint=str(ckpt))
    resume = time.perf_counter() - t
    same = all(torch.equal(again.model.state_dict()[k], v) for k, v in saved.items())
    result = {"mode": mode, "save_s": save, "durable_s": save + sync, "resume_s": resume,
              "bytes": sum(p.stat().st_size for p in files), "same_weights": same,
              "files": [p.name for p in files]}
    reply.write(json.dumps(result) + "\n")
    return result


def run(directory: str, *, rounds: int, small: bool) -> dict[str, Any]:
    """``rounds`` paired rounds of a stock and a routed process, alternating which goes first."""
    per: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for r in range(rounds):
        for mode in round_order(MODES, r):
            progress(f"trainer round {r + 1}/{rounds}: {mode}")
            out = Path(directory) / f"{mode}-{r}"
            done = subprocess.run([sys.executable, "-m", "benchmarks.trainer", str(out), mode,
                                   *(["--small"] if small else [])],
                                  capture_output=True, text=True, env=child_env())
            if done.returncode != 0:
                raise RuntimeError(f"the {mode} Trainer failed:\n{done.stderr[-4000:]}")
            per[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
            subprocess.run(["rm", "-rf", str(out)], check=True)
    return {"rounds": per, "model": "GPT-2 2x256" if small else "GPT-2 small (124M)"}


def _col(per: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in per]


def format_report(result: dict[str, Any]) -> str:
    per = result["rounds"]
    stock, routed = per["stock"], per["routed"]
    gb = stock[0]["bytes"] / 1e9
    lines = [f"Hugging Face Trainer checkpoint of {result['model']}, {gb:.2f} GB "
             f"({', '.join(stock[0]['files'])}); {len(stock)} rounds", "",
             f"{'':12}{'stock s':>10}{'routed s':>10}{'stock/routed':>14}  (spread)"]
    for key, label in (("save_s", "save"), ("durable_s", "durable"), ("resume_s", "resume")):
        s, r = _col(stock, key), _col(routed, key)
        ratios = paired_ratios(r, s)
        lines.append(f"{label:<12}{statistics.median(s):>10.2f}{statistics.median(r):>10.2f}"
                     f"{statistics.median(ratios):>13.2f}x  ({spread_text(ratios)})")
    same = all(x["same_weights"] for x in stock + routed)
    lines += ["", f"resumed weights equal the saved ones bit for bit in every round: {same}",
              "save: the Trainer's stall at its checkpoint (routed saves are durable, stock ones are not); "
              "durable: until every file is fsynced; resume: train(resume_from_checkpoint) from a cold cache, "
              "set-up included"]
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``trainer`` to the benchmarks' subcommands."""
    p = add_command(sub, "trainer", help="a transformers.Trainer's checkpoint save and resume, routed vs stock",
                    description=_DESCRIPTION, func=_cmd_trainer,
                    dir_help="parent directory on the filesystem to measure (default: .); the run uses a "
                             "temporary directory inside it and leaves nothing behind")
    p.add_argument("--rounds", type=int, default=5, help="paired rounds (default 5)")
    p.add_argument("--quick", action="store_true", help="a 2-layer GPT-2 of width 256 instead of GPT-2 small")


def _cmd_trainer(args: argparse.Namespace) -> int:
    with temp_dir(args.dir, "trainer") as d:
        result = run(d, rounds=args.rounds, small=args.quick)
    return finish(result, args, format_report)


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2], "--small" in sys.argv[3:])
