# The machine-level figure a process tree's PSS total is compared with: the number of distinct
# physical pages mapped by the tree (the root and every descendant), from /proc/<pid>/pagemap.
# A page shared copy-on-write by a parent and its workers is one physical page here, however many
# processes map it. Needs CAP_SYS_ADMIN for the page-frame numbers (0 otherwise).
import os, struct

PAGE = os.sysconf("SC_PAGE_SIZE")


def descendants(root):
    out, todo = [root], [root]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{pid}/task/{t}/children") as f:
                    kids = [int(c) for c in f.read().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


def frames(pid):
    seen = set()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pm:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            try:
                pm.seek(lo // PAGE * 8)
                data = pm.read((hi - lo) // PAGE * 8)
            except OSError:
                continue
            for (v,) in struct.iter_unpack("Q", data):
                if v >> 63:
                    seen.add(v & ((1 << 55) - 1))
    return seen


def tree_bytes(root):
    """Bytes of distinct physical pages mapped by `root` and its descendants; None when the
    kernel hides page-frame numbers."""
    union = set()
    for pid in descendants(root):
        try:
            union |= frames(pid)
        except OSError:
            pass
    union.discard(0)
    return len(union) * PAGE if union else None


def hold_and_measure(out_path, seconds=4.0):
    """Measures the tree's distinct physical bytes, holds still for `seconds` (the sidecar samples
    meanwhile), measures again, and writes both with the window in Unix milliseconds."""
    import json, time
    t0 = time.time()
    first = tree_bytes(os.getpid())
    time.sleep(seconds)
    last = tree_bytes(os.getpid())
    t1 = time.time()
    with open(out_path, "w") as f:
        json.dump({"tree_bytes": first, "tree_bytes_end": last,
                   "from_unix_ms": int(t0 * 1000), "to_unix_ms": int(t1 * 1000)}, f)
