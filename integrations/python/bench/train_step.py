"""A small PyTorch CPU training step, timed inside the process (a workload of overhead.py).

A 2-layer MLP (512 -> 1024 -> 10, batch 64) with Adam, one thread, fixed seed: `--warmup` steps,
then `--steps` timed steps with time.perf_counter. Prints one parseable line:

    BENCH train_step median_s=<median step> min_s=<fastest step> loop_s=<all timed steps> steps=<n>
"""

import argparse

import torch

from timing import time_and_report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=1024)
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, args.hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, 10),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(args.batch, 512)
    y = torch.randint(0, 10, (args.batch,))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    time_and_report("train_step", args.steps, lambda i: step())


if __name__ == "__main__":
    main()
