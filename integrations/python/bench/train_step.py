"""A small PyTorch CPU training step, timed inside the process (a workload of overhead.py).

A 2-layer MLP (512 -> 1024 -> 10, batch 64) with Adam, one thread, fixed seed: `--warmup` steps,
then `--steps` timed steps with time.perf_counter. Prints one parseable line:

    BENCH train_step median_s=<median step> min_s=<fastest step> loop_s=<all timed steps> steps=<n>
"""

import argparse
import statistics
import time

import torch


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
    times = []
    t_loop = time.perf_counter()
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    loop = time.perf_counter() - t_loop
    print(
        f"BENCH train_step median_s={statistics.median(times):.9f} min_s={min(times):.9f} "
        f"loop_s={loop:.9f} steps={args.steps}",
        flush=True,
    )


if __name__ == "__main__":
    main()
