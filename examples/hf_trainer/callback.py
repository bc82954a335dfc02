"""The Hugging Face Trainer under trainctl: save on the checkpoint signal, stop cleanly on
SIGTERM, report the step and the loss, resume from the checkpoint trainctl hands over.

    trainer = Trainer(..., callbacks=[TrainctlCallback()])
    trainer.train(resume_from_checkpoint=trainctl_trainer.resume_from() or ...)

Spec (job.toml): checkpoint = "out/checkpoint-*" (complete only with trainer_state.json,
which the Trainer writes last; trainctl reads the step from the folder's name). Run in CI
on a tiny model (train.py; tests/frameworks/test_recipes_hf_lightning.py).
"""

from transformers import TrainerCallback

from trainctl.launcher import trainer as trainctl_trainer


class TrainctlCallback(TrainerCallback):  # type: ignore[misc]
    def on_train_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        trainctl_trainer.install_handlers()

    def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
        if state.is_world_process_zero and logs and "loss" in logs:
            trainctl_trainer.report(step=state.global_step, loss=logs["loss"])

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if state.is_world_process_zero:
            trainctl_trainer.report(step=state.global_step)
        if trainctl_trainer.checkpoint_requested():  # `trainctl stop --at checkpoint`
            control.should_save = True
        if trainctl_trainer.should_stop():  # `trainctl stop`: save, then end training
            control.should_save = True
            control.should_training_stop = True
        return control
