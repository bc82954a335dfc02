"""A PyTorch Lightning fit under trainctl: a tiny model on random data (CPU), shaped as
real scripts are: `ModelCheckpoint` saves `out/epoch=E-step=S.ckpt` every
`--every_n_steps` (the newest 2 kept: they no longer pile up) and `out/last.ckpt` (rewritten
in place), and it resumes on a plain start.

    python train.py [--every_n_steps=10]

Resuming: `trainer.resume_from()` (the newest *complete* checkpoint trainctl hands in
$TRAINCTL_RESUME_FROM on every start of a job that has one; a torn `last.ckpt` is never
handed), else Lightning's own `"last"` outside trainctl.
"""

import os
import sys
import time

import lightning as L  # noqa: N812
import torch
from callback import TrainctlCallback
from lightning.pytorch.callbacks import ModelCheckpoint

from trainctl.launcher import trainer as trainctl_trainer

args = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:])
OUT = os.path.abspath(args.get("out", "out"))


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 16)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        time.sleep(float(os.environ.get("STEP_SLEEP", "0.05")))  # a real step takes time
        loss = (self.layer(batch) - batch).pow(2).mean()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


torch.manual_seed(0)
data = torch.utils.data.DataLoader(torch.randn(1 << 16, 16), batch_size=8)
keep = ModelCheckpoint(
    dirpath=OUT,
    filename="{epoch}-{step}",
    every_n_train_steps=int(args.get("every_n_steps", "10")),
    save_top_k=2,  # the newest two (by step): without it the files pile up
    monitor="step",
    mode="max",
    save_last=True,
)
trainer = L.Trainer(
    accelerator="cpu",
    max_steps=int(args.get("max_steps", "100000")),
    callbacks=[keep, TrainctlCallback(OUT)],
    logger=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
handed = trainctl_trainer.resume_from()
resume = handed or ("last" if os.path.exists(os.path.join(OUT, "last.ckpt")) else None)
print(f"resuming from {resume}" if resume else "starting from scratch", flush=True)
trainer.fit(Tiny(), data, ckpt_path=resume)
