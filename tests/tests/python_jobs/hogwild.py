"""Hogwild training as pytorch/examples/mnist_hogwild writes it: the parent shares a model's
parameters, starts N `multiprocessing` children (`spawn`) that each train it with their own SGD
optimizer, joins them and only evaluates. Each child holds HOLD_MIB MiB more during its steps than
the parent ever does. Writes the truth (each child's pid and optimizer steps) to argv[1]."""
import json
import os
import sys

import torch
import torch.multiprocessing as mp

STEPS = int(os.environ.get("HOG_STEPS", "12"))
HOLD = int(os.environ.get("HOLD_MIB", "48")) << 20


def train(model, out_dir):
    torch.manual_seed(os.getpid())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    held = bytearray(HOLD)
    for _ in range(STEPS):
        x = torch.randn(32, 64)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
    with open(os.path.join(out_dir, f"child-{os.getpid()}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "steps": STEPS, "held": len(held)}, f)


def main():
    truth_path = sys.argv[1]
    out_dir = os.path.dirname(truth_path)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    model.share_memory()
    children = [mp.get_context("spawn").Process(target=train, args=(model, out_dir)) for _ in range(2)]
    for c in children:
        c.start()
    for c in children:
        c.join()
    model.eval()
    with torch.no_grad():
        model(torch.randn(256, 64))
    kids = [json.load(open(os.path.join(out_dir, f"child-{c.pid}.json"))) for c in children]
    with open(truth_path, "w") as f:
        json.dump({"parent": os.getpid(), "children": kids}, f)


if __name__ == "__main__":
    main()
