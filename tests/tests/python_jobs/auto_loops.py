"""Training loops written the way third parties write them, for the automatic steps and phases:
argv[1] names the loop, argv[2] is where its truth goes (JSON: the optimizer steps it took, its
iterations, and where it allocated its known block). With ``BLOCK_AT=ITERATION:PHASE`` the loop
allocates 200 MiB of tensor storage (held for a moment) in that phase (forward, backward, data,
eval) of that iteration: the heap's peak, whose step and phase the report is checked against.

- ``accumulate``: 6 optimizer steps of 4 micro-batches each, batches from a DataLoader;
- ``validate``: 9 steps, a validation (``model.eval()``, ``torch.no_grad()``) after every third;
- ``gan``: 6 iterations of a GAN, the discriminator's optimizer then the generator's each;
- ``updates_per_batch``: 4 fetched batches, 3 optimizer steps on each (PPO-style epochs);
- ``epochs``: 3 epochs of 4 steps, each epoch over a DataLoader of its own (made in the loop).
"""

import json
import os
import sys

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
LOOP, TRUTH = sys.argv[1], sys.argv[2]
WANT = os.environ.get("BLOCK_AT", "")
truth = {"loop": LOOP, "iterations": 0, "optimizer_steps": 0}
now = {"iteration": 0, "done": False}


def block(phase):
    if now["done"] or WANT != f"{now['iteration']}:{phase}":
        return
    now["done"] = True
    held = torch.ones(50 << 20)  # THE BLOCK: 200 MiB
    truth["block"] = {"iteration": now["iteration"], "phase": phase,
                      "bytes": held.untyped_storage().nbytes()}
    float(held.sum())


class InBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        block("backward")
        return grad


class Net(nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.a, self.b = nn.Linear(width, 128), nn.Linear(128, 1)

    def forward(self, x):
        block("forward" if self.training and torch.is_grad_enabled() else "eval")
        return self.b(InBackward.apply(torch.relu(self.a(x))))


class Data(torch.utils.data.Dataset):
    def __init__(self, n=512):
        self.x, self.y = torch.randn(n, 64), torch.randn(n, 1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        block("data")
        return self.x[i], self.y[i]


class CountingSGD(torch.optim.SGD):
    """A subclass whose step calls its base's (PyTorch runs the step hooks for both)."""

    def step(self, closure=None):
        truth["optimizer_steps"] += 1
        return super().step(closure)


def batches():
    return iter(torch.utils.data.DataLoader(Data(), batch_size=8))


def train_on(model, opt, x, y, scale=1.0):
    (((model(x) - y) ** 2).mean() * scale).backward()


def accumulate():
    model = Net()
    opt, data = CountingSGD(model.parameters(), lr=0.01), batches()
    for it in range(6):
        now["iteration"] = it
        for _ in range(4):
            train_on(model, opt, *next(data), scale=0.25)
        opt.step()
        opt.zero_grad()
        truth["iterations"] += 1


def validate():
    model = Net()
    opt, data, held_out = CountingSGD(model.parameters(), lr=0.01), batches(), torch.randn(32, 64)
    for it in range(9):
        now["iteration"] = it
        train_on(model, opt, *next(data))
        opt.step()
        opt.zero_grad()
        if it % 3 == 2:
            model.eval()
            with torch.no_grad():
                model(held_out)
            model.train()
        truth["iterations"] += 1


def gan():
    gen, critic, data = Net(16), Net(64), batches()
    shape = nn.Linear(1, 64)
    opt_g = CountingSGD(list(gen.parameters()) + list(shape.parameters()), lr=0.01)
    opt_d = torch.optim.SGD(critic.parameters(), lr=0.01)
    for it in range(6):
        now["iteration"] = it
        real, _ = next(data)
        fake = shape(gen(torch.randn(8, 16)))
        opt_d.zero_grad()
        (critic(real).mean() - critic(fake.detach()).mean()).backward()
        opt_d.step()
        opt_g.zero_grad()
        (-critic(fake).mean()).backward()
        opt_g.step()
        truth["iterations"] += 1


def updates_per_batch():
    model = Net()
    opt, data = CountingSGD(model.parameters(), lr=0.01), batches()
    for it in range(4):
        x, y = next(data)
        for k in range(3):
            now["iteration"] = 3 * it + k
            train_on(model, opt, x, y)
            opt.step()
            opt.zero_grad()
            truth["iterations"] += 1


def epochs():
    model, data = Net(), Data(n=32)
    opt = CountingSGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        for n, (x, y) in enumerate(torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)):
            now["iteration"] = 4 * epoch + n + 1  # the next fetch's (it comes before the body)
            train_on(model, opt, x, y)
            opt.step()
            opt.zero_grad()
            truth["iterations"] += 1


{"accumulate": accumulate, "epochs": epochs, "validate": validate, "gan": gan,
 "updates_per_batch": updates_per_batch}[LOOP]()
with open(TRUTH, "w") as out:
    json.dump(truth, out)
