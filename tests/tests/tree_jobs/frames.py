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


def sidecar_socket():
    """The live socket of the `memsight run` watching this process, or None."""
    import glob
    uid = os.getuid()
    pid = os.getpid()
    bases = []
    if os.environ.get("XDG_RUNTIME_DIR"):
        bases.append(os.path.join(os.environ["XDG_RUNTIME_DIR"], "memsight"))
    for root in ("/dev/shm", os.environ.get("TMPDIR") or "/tmp"):
        bases.append(f"{root}/memsight-{uid}")
    bases.append(os.path.expanduser("~/.cache/memsight/runtime"))
    for b in bases:
        for p in [os.path.join(b, f"sidecar-{pid}.sock")] + glob.glob(os.path.join(b, f"sidecar-{pid}.*.sock")):
            if os.path.exists(p):
                return p
    return None


def wait_for_tree_samples(count, deadline_s=180.0):
    """Blocks until the sidecar has sent `count` new process-tree samples on its live socket (the
    event this job waits for, whatever the machine's load), or the deadline passes. False when
    there is no socket to watch."""
    import json, socket, time
    path = None
    end = time.time() + deadline_s
    while path is None and time.time() < end:
        path = sidecar_socket()
        if path is None:
            time.sleep(0.1)
    if path is None:
        return False
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.settimeout(1.0)
    buf, lines, seen = b"", 0, 0
    while seen < count and time.time() < end:
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            lines += 1
            if lines <= 2:  # the hello and the state already held: not new samples
                continue
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("type") == "snapshot" and r.get("tree"):
                seen += 1
    s.close()
    return seen >= count


def hold_and_measure(out_path, seconds=4.0):
    """Measures the tree's distinct physical bytes, holds still until the sidecar has sampled the
    tree three times (read from its live socket; `seconds` where there is none), measures again,
    and writes both with the window in Unix milliseconds."""
    import json, time
    t0 = time.time()
    first = tree_bytes(os.getpid())
    time.sleep(0.3)  # the test's margin at the window's start
    if not wait_for_tree_samples(3):
        time.sleep(seconds)
    time.sleep(0.3)  # and at its end
    last = tree_bytes(os.getpid())
    t1 = time.time()
    with open(out_path, "w") as f:
        json.dump({"tree_bytes": first, "tree_bytes_end": last,
                   "from_unix_ms": int(t0 * 1000), "to_unix_ms": int(t1 * 1000)}, f)
