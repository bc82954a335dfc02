"""PyTorch Lightning under trainctl: save on the checkpoint signal, stop cleanly on
SIGTERM, report the step and the loss, resume from the checkpoint trainctl hands over.

    trainer = L.Trainer(callbacks=[TrainctlCallback("out")], ...)
    trainer.fit(model, ckpt_path=trainctl_trainer.resume_from() or ...)

Lightning 2.6 registers a SIGTERM handler of its own in every `fit` (not only under
SLURM): it makes the fit raise `SIGTERMException` at the next batch's end, with no
checkpoint saved and a traceback for an exit. This callback's handlers, installed when
the fit starts (after Lightning's), replace it: a stop finishes the step, saves
`epoch=E-step=S.ckpt`, and ends the fit cleanly. Spec: checkpoint = "out/*.ckpt" (a
torch.save zip: complete with its end record; the step from its name, or the log's for
`last.ckpt`). Run in CI on a tiny model (train.py;
tests/frameworks/test_recipes_hf_lightning.py).
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
            loss = outputs.get("loss") if isinstance(outputs, dict) else None
            trainctl_trainer.report(step=step, **({} if loss is None else {"loss": float(loss)}))
        asked = trainctl_trainer.checkpoint_requested()
        stop = trainctl_trainer.should_stop()
        if asked or stop:
            path = os.path.join(self.out, f"epoch={trainer.current_epoch}-step={step}.ckpt")
            trainer.save_checkpoint(path)  # every rank calls it; rank 0 writes
        if stop:
            trainer.should_stop = True
