"""memsight for Hugging Face ``transformers.Trainer``: steps, phases and PyTorch's device memory
in the report, with one callback::

    from memsight.transformers import MemsightCallback
    trainer = Trainer(model, args, ..., callbacks=[MemsightCallback()])

Each optimizer step is marked as ``state.global_step`` (0 for the first); its work runs in phase
``train``, the optimizer's update in ``train/optimizer``, and evaluation in phase ``eval``. At
``on_train_begin`` it calls :func:`memsight.torch.install`. Without a memsight session every mark
is a no-op.
"""

try:
    import transformers
except ImportError as e:  # pragma: no cover - exercised where transformers is missing
    raise ImportError(
        "memsight.transformers needs the `transformers` package (pip install transformers); "
        "without it, mark steps yourself with memsight.step(n) and memsight.phase(name)"
    ) from e

from memsight._callbacks import Marks

__all__ = ["MemsightCallback"]


class MemsightCallback(transformers.TrainerCallback):
    """Marks the Trainer's steps and its ``train``, ``train/optimizer`` and ``eval`` phases.

    ``install_torch=False`` leaves PyTorch's device memory out (see :mod:`memsight.torch`);
    ``interval`` is its sampling interval in seconds.
    """

    def __init__(self, install_torch=True, interval=0.1):
        self.marks = Marks(install_torch, interval)

    def on_train_begin(self, args, state, control, **kwargs):
        self.marks.start()

    def on_step_begin(self, args, state, control, **kwargs):
        self.marks.close("eval")
        self.marks.step(state.global_step)
        self.marks.open("train")

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.marks.open("optimizer")

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.marks.close("optimizer")

    def on_step_end(self, args, state, control, **kwargs):
        self.marks.close("train")
        # The flow callback, which runs first, has decided whether evaluation follows this step.
        if control.should_evaluate:
            self.marks.open("eval")

    def on_epoch_end(self, args, state, control, **kwargs):
        if control.should_evaluate:
            self.marks.open("eval")

    def on_prediction_step(self, args, state, control, **kwargs):
        # `trainer.evaluate()` or `predict()` called outside training: from its first batch on.
        if not self.marks.is_open("train"):
            self.marks.open("eval")

    def on_evaluate(self, args, state, control, **kwargs):
        self.marks.close("eval")

    def on_predict(self, args, state, control, metrics=None, **kwargs):
        self.marks.close("eval")

    def on_train_end(self, args, state, control, **kwargs):
        self.marks.close_all()
