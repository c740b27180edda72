"""memsight for PyTorch Lightning: steps, phases and PyTorch's device memory in the report, with
one callback (works with ``lightning`` and with the older ``pytorch_lightning`` package)::

    from memsight.lightning import MemsightCallback
    trainer = lightning.Trainer(..., callbacks=[MemsightCallback()])

Each training batch is marked with ``trainer.global_step`` (micro-batches of one optimizer step
share it) and runs in phase ``train``, the optimizer's update in ``train/optimizer``; validation
and test loops run in phase ``eval``. At ``on_fit_start`` it calls :func:`memsight.torch.install`.
Without a memsight session every mark is a no-op.
"""

try:
    from lightning.pytorch import Callback
except ImportError:
    try:
        from pytorch_lightning import Callback
    except ImportError as e:  # pragma: no cover - exercised where neither is installed
        raise ImportError(
            "memsight.lightning needs PyTorch Lightning (pip install lightning, or the older "
            "pytorch_lightning); without it, mark steps yourself with memsight.step(n) and "
            "memsight.phase(name)"
        ) from e

from memsight._callbacks import Marks

__all__ = ["MemsightCallback"]


class MemsightCallback(Callback):
    """Marks Lightning's steps and its ``train``, ``train/optimizer`` and ``eval`` phases.

    ``install_torch=False`` leaves PyTorch's device memory out (see :mod:`memsight.torch`);
    ``interval`` is its sampling interval in seconds.
    """

    def __init__(self, install_torch=True, interval=0.1):
        self.marks = Marks(install_torch, interval)

    def on_fit_start(self, trainer, pl_module):
        self.marks.start()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.marks.step(trainer.global_step)
        self.marks.open("train")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        # Called after the forward/backward closure, just before the parameters are updated.
        if self.marks.is_open("train"):
            self.marks.open("optimizer")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.marks.close("train")

    def on_validation_start(self, trainer, pl_module):
        self.marks.open("eval")

    def on_validation_end(self, trainer, pl_module):
        self.marks.close("eval")

    def on_test_start(self, trainer, pl_module):
        self.marks.open("eval")

    def on_test_end(self, trainer, pl_module):
        self.marks.close("eval")

    def on_exception(self, trainer, pl_module, exception):
        self.marks.close_all()

    def on_fit_end(self, trainer, pl_module):
        self.marks.close_all()
