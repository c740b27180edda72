"""A loop that updates its parameters by hand, as pytorch/examples' word_language_model does by
default (no torch.optim): ITERS iterations of forward, backward and `p.data.add_(p.grad, ...)`,
from a DataLoader or not (HAND_LOADER=1). Writes the truth (iterations) to argv[1]."""
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

ITERS = 12
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
data = TensorDataset(torch.randn(ITERS * 8, 32), torch.randn(ITERS * 8, 1))
batches = DataLoader(data, batch_size=8) if os.environ.get("HAND_LOADER") == "1" else (
    (data.tensors[0][i * 8:(i + 1) * 8], data.tensors[1][i * 8:(i + 1) * 8]) for i in range(ITERS))
done = 0
for x, y in batches:
    model.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-0.01)
    done += 1
with open(sys.argv[1], "w") as f:
    json.dump({"iterations": done}, f)
