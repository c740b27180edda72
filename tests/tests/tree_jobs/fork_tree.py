# A parent that touches 200 MiB and forks two children that keep it shared copy-on-write; the
# second writes 50 MiB of its own. While all three hold their memory, measures the tree's distinct
# physical bytes and holds still (frames.hold_and_measure), writing to argv[1].
import json, os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from frames import hold_and_measure

shared = b"\x01" * (200 << 20)
kids = []
for k in range(2):
    pid = os.fork()
    if pid == 0:
        mine = b"\x02" * (50 << 20) if k == 1 else b""
        time.sleep(5)
        os._exit(0)
    kids.append(pid)
time.sleep(1.0)
hold_and_measure(sys.argv[1])
for p in kids:
    os.waitpid(p, 0)
