"""A Hugging Face `Trainer` run under trainctl: a tiny GPT-2 on random tokens (CPU, no
download), as a real script would be shaped: output in `out/`, a checkpoint every
`--save_steps` (`out/checkpoint-N/`, rotated by `save_total_limit`), and it resumes on a
plain start.

    python train.py [--save_steps=10] [--max_steps=100000]

Resuming: `trainer.resume_from()` (the newest *complete* checkpoint trainctl hands in
$TRAINCTL_RESUME_FROM on every start of a job that has one), else the newest complete
`checkpoint-N/` of our own (one with its `trainer_state.json`, which the Trainer writes
last; HF's own `get_last_checkpoint` also takes a torn folder, and a run killed in its
first save then crash-loops on it).
"""

import os
import sys
import time

import torch
from callback import TrainctlCallback
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from trainctl.launcher import trainer as trainctl_trainer

args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:])
OUT = os.path.abspath(args.get("output_dir", "out"))


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def last_complete(out: str) -> str | None:
    """The newest checkpoint-N/ that has its trainer_state.json (written last)."""
    done = [
        d for d in os.listdir(out) if d.startswith("checkpoint-")
        and os.path.exists(os.path.join(out, d, "trainer_state.json"))
    ] if os.path.isdir(out) else []  # fmt: skip
    return os.path.join(out, max(done, key=lambda d: int(d.split("-")[1]))) if done else None


class Slow(TrainctlCallback):  # a step of a real model takes time; this one ~1 ms
    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(float(os.environ.get("STEP_SLEEP", "0.05")))
        return super().on_step_end(args, state, control, **kwargs)


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2))
trainer = Trainer(
    model=model,
    args=TrainingArguments(
        output_dir=OUT,
        max_steps=int(args.get("max_steps", "100000")),
        save_steps=int(args.get("save_steps", "10")),
        save_total_limit=2,
        logging_steps=1,
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    ),
    train_dataset=Tokens(),
    callbacks=[Slow()],
)
resume = trainctl_trainer.resume_from() or last_complete(OUT)
print(f"resuming from {resume}" if resume else "starting from scratch", flush=True)
trainer.train(resume_from_checkpoint=resume)
