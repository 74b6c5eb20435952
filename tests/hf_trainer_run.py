"""A transformers.Trainer run on a tiny GPT-2 built from a config (no download), for the tests of
pyfastensor.route() with a real framework (tests/test_route_frameworks.py).

    python tests/hf_trainer_run.py OUT --steps 12 --save-steps 4 [--routed] [--kill-at 10] [--resume]

Trains on a fixed random dataset, saving a checkpoint every ``--save-steps`` steps under OUT;
``--kill-at N`` SIGKILLs the process at the end of step N (after the checkpoints before it are
whole); ``--resume`` resumes from the last checkpoint in OUT. At the end it writes the model's
weights to OUT/final.pt with torch.save (pyfastensor's when routed).
"""

from __future__ import annotations

import argparse
import os
import signal


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-steps", type=int, default=4)
    p.add_argument("--routed", action="store_true")
    p.add_argument("--kill-at", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    a = p.parse_args()

    import pyfastensor

    if a.routed:  # before transformers is imported, as a program that routes at its start does
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

    transformers.logging.set_verbosity_error()
    transformers.set_seed(0)
    # The token embedding is 1 MiB (4096 x 64 float32): pyfastensor's safetensors file starts its
    # data on 4 KiB there, which tells its files from the safetensors package's.
    model = GPT2LMHeadModel(GPT2Config(vocab_size=4096, n_positions=32, n_embd=64, n_layer=2, n_head=2))
    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 4096, (96, 16), generator=g)]

    class Kill(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003, ANN201
            if a.kill_at and state.global_step == a.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    args = TrainingArguments(
        output_dir=a.out, max_steps=a.steps, save_steps=a.save_steps, per_device_train_batch_size=4,
        learning_rate=1e-3, logging_steps=1000, report_to=[], seed=0, use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0, save_safetensors=True)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Kill()])
    trainer.train(resume_from_checkpoint=True if a.resume else None)
    torch.save(trainer.model.state_dict(), os.path.join(a.out, "final.pt"))


if __name__ == "__main__":
    main()
