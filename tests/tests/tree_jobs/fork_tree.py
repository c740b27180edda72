# A parent that touches 200 MiB and forks two children that keep it shared copy-on-write; the
# second writes 50 MiB of its own. While all three hold their memory, measures the tree's distinct
# physical bytes and holds still (frames.hold_and_measure), writing to argv[1].
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from frames import hold_and_measure

shared = b"\x01" * (200 << 20)
# The children hold until the parent has measured (they read a pipe the parent then closes):
# however slowly the sidecar samples, they are there for all of it.
hold_r, hold_w = os.pipe()
ready_r, ready_w = os.pipe()
kids = []
for k in range(2):
    pid = os.fork()
    if pid == 0:
        os.close(hold_w)
        mine = b"\x02" * (50 << 20) if k == 1 else b""
        os.write(ready_w, b"x")
        os.read(hold_r, 1)
        os._exit(0)
    kids.append(pid)
os.read(ready_r, 1)
os.read(ready_r, 1)
hold_and_measure(sys.argv[1])
os.close(hold_w)
for p in kids:
    os.waitpid(p, 0)
