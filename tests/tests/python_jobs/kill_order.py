"""Two processes of one job are SIGKILLed in turn: first a training loop with a live DataLoader
worker (forked: it shares its parent's flight-recorder lock), then, 3 s later, a process that only
holds memory. Writes the truth (pids and kill times) to argv[1] and exits 1, as a launcher would."""
import json
import os
import signal
import subprocess
import sys
import time

TRAIN = r"""
import time, torch
from torch.utils.data import DataLoader, TensorDataset
ds = TensorDataset(torch.randn(100000, 64), torch.randint(0, 10, (100000,)))
m = torch.nn.Linear(64, 10); opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i, (x, y) in enumerate(DataLoader(ds, batch_size=32, num_workers=1)):
    loss = torch.nn.functional.cross_entropy(m(x), y); opt.zero_grad(); loss.backward(); opt.step()
    print("step", i + 1, flush=True); time.sleep(0.05)
"""
HOLD = "import time; b = bytearray(24 << 20); print('held', flush=True); time.sleep(600)"

truth = {}
holder = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True)
holder.stdout.readline()
trainer = subprocess.Popen([sys.executable, "-c", TRAIN], stdout=subprocess.PIPE, text=True)
for line in trainer.stdout:
    if line.startswith("step 8"):
        break
truth["trainer"] = {"pid": trainer.pid, "killed_ms": int(time.time() * 1000)}
os.kill(trainer.pid, signal.SIGKILL)
trainer.wait()
time.sleep(3)
truth["holder"] = {"pid": holder.pid, "killed_ms": int(time.time() * 1000)}
os.kill(holder.pid, signal.SIGKILL)
holder.wait()
with open(sys.argv[1], "w") as f:
    json.dump(truth, f)
sys.exit(1)
