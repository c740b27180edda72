"""The framework callbacks on the real packages: a tiny Hugging Face Trainer run and a tiny
Lightning fit under memsight, whose reports must hold the steps and phases the callbacks marked.
Each skips, saying why, where its package is not installed; a missing package gives the import
error memsight promises.

Run: python -m unittest discover -s integrations/python/tests -v
"""

import unittest

from harness import last_json, need, phases, run, source, steps


class Transformers(unittest.TestCase):
    def setUp(self):
        need("torch", "transformers")

    def test_trainer_steps_and_phases(self):
        report, out = run(
            """
            import json, os, torch, transformers
            from memsight.transformers import MemsightCallback

            torch.manual_seed(0)
            config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2,
                                             n_head=2, bos_token_id=0, eos_token_id=0)
            model = transformers.GPT2LMHeadModel(config)
            data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (16, 16))]
            args = transformers.TrainingArguments(
                output_dir=os.environ["TEST_TMP"], max_steps=4, per_device_train_batch_size=2,
                per_device_eval_batch_size=4, eval_strategy="steps", eval_steps=2,
                save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
                logging_strategy="no", dataloader_num_workers=0)
            trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                           eval_dataset=data[:8], callbacks=[MemsightCallback()])
            trainer.train()
            print(json.dumps({"transformers": transformers.__version__}))
            """
        )
        last_json(out)
        self.assertEqual(steps(report), [0, 1, 2, 3])
        got = phases(report)
        self.assertEqual(got.get("train"), 4, got)
        self.assertEqual(got.get("train/optimizer"), 4, got)
        self.assertEqual(got.get("eval"), 2, got)  # after steps 2 and 4
        self.assertIsNotNone(source(report, "torch-cuda"))  # install() ran at on_train_begin

    def test_evaluate_outside_training(self):
        report, _ = run(
            """
            import os, torch, transformers
            from memsight.transformers import MemsightCallback

            config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2,
                                             n_head=2, bos_token_id=0, eos_token_id=0)
            data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (8, 16))]
            args = transformers.TrainingArguments(output_dir=os.environ["TEST_TMP"], report_to=[],
                                                  use_cpu=True, disable_tqdm=True, per_device_eval_batch_size=4)
            trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args,
                                           eval_dataset=data, callbacks=[MemsightCallback()])
            trainer.evaluate()
            """
        )
        self.assertEqual(phases(report), {"eval": 1})

    def test_import_error_without_transformers(self):
        _, out = run(
            """
            import sys
            sys.modules["transformers"] = None  # as if not installed
            try:
                import memsight.transformers
            except ImportError as e:
                print(e)
            """,
            preload=False,
        )
        self.assertIn("memsight.transformers needs the `transformers` package", out)


class Lightning(unittest.TestCase):
    def setUp(self):
        need("torch", "lightning")

    def test_fit_steps_and_phases(self):
        report, out = run(
            """
            import json, torch
            import lightning as L
            from memsight.lightning import MemsightCallback

            class Tiny(L.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.layer = torch.nn.Linear(8, 1)
                def training_step(self, batch, i):
                    x, y = batch
                    return torch.nn.functional.mse_loss(self.layer(x), y)
                def validation_step(self, batch, i):
                    x, y = batch
                    return torch.nn.functional.mse_loss(self.layer(x), y)
                def configure_optimizers(self):
                    return torch.optim.SGD(self.parameters(), lr=0.1)

            torch.manual_seed(0)
            data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
            loader = lambda: torch.utils.data.DataLoader(data, batch_size=4)
            trainer = L.Trainer(max_steps=4, val_check_interval=2, limit_val_batches=2,
                                num_sanity_val_steps=0, accelerator="cpu", devices=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, callbacks=[MemsightCallback()])
            trainer.fit(Tiny(), loader(), loader())
            print(json.dumps({"global_step": trainer.global_step}))
            """
        )
        self.assertEqual(last_json(out), {"global_step": 4})
        self.assertEqual(steps(report), [0, 1, 2, 3])
        got = phases(report)
        self.assertEqual(got.get("train"), 4, got)
        self.assertEqual(got.get("train/optimizer"), 4, got)
        self.assertEqual(got.get("eval"), 2, got)
        self.assertIsNotNone(source(report, "torch-cuda"))

    def test_import_error_without_lightning(self):
        _, out = run(
            """
            import sys
            sys.modules["lightning"] = sys.modules["pytorch_lightning"] = None
            try:
                import memsight.lightning
            except ImportError as e:
                print(e)
            """,
            preload=False,
        )
        self.assertIn("memsight.lightning needs PyTorch Lightning", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
