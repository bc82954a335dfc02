"""PyTorch Lightning under trainctl: save on the checkpoint signal, stop cleanly on
SIGTERM, resume from the checkpoint trainctl hands over.

    trainer = L.Trainer(callbacks=[TrainctlCallback("out")], ...)
    trainer.fit(model, ckpt_path=trainctl_trainer.resume_from())

Lightning installs its own SIGTERM handling under SLURM only; elsewhere this callback's
flags are the way. Spec: checkpoint = "out/*.ckpt" (a torch.save zip: complete with its
end record; the step from `epoch=3-step=1200` in its name). Not run in CI (lightning is
not a test dependency); examples/torchrun_ddp, which CI runs, exercises the same flags.
"""

import os

import lightning as L  # noqa: N812

from trainctl.launcher import trainer as trainctl_trainer


class TrainctlCallback(L.Callback):  # type: ignore[misc]
    def __init__(self, out: str) -> None:
        self.out = out

    def on_fit_start(self, trainer, pl_module):  # type: ignore[no-untyped-def]
        trainctl_trainer.install_handlers()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]
        step = trainer.global_step
        if trainer.is_global_zero:
            trainctl_trainer.report(step=step)
        asked = trainctl_trainer.checkpoint_requested()
        stop = trainctl_trainer.should_stop()
        if asked or stop:
            path = os.path.join(self.out, f"epoch={trainer.current_epoch}-step={step}.ckpt")
            trainer.save_checkpoint(path)  # every rank calls it; rank 0 writes
        if stop:
            trainer.should_stop = True
