# A parent that touches 200 MiB and forks two children that keep it shared copy-on-write; the
# second writes 50 MiB of its own. Writes the tree's distinct physical bytes to argv[1] while all
# three hold their memory, then holds still for the sidecar.
import json, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from frames import tree_bytes

shared = b"\x01" * (200 << 20)
kids = []
for k in range(2):
    pid = os.fork()
    if pid == 0:
        mine = b"\x02" * (50 << 20) if k == 1 else b""
        time.sleep(4)
        os._exit(0)
    kids.append(pid)
time.sleep(1.0)
with open(sys.argv[1], "w") as f:
    json.dump({"tree_bytes": tree_bytes(os.getpid()), "kids": kids}, f)
for p in kids:
    os.waitpid(p, 0)
