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


def sidecar_sockets():
    """The sockets that may be the live one of the `memsight run`/`attach` watching this process
    (stale ones of an earlier process with this pid may be among them)."""
    import glob
    uid = os.getuid()
    pid = os.getpid()
    bases = []
    if os.environ.get("XDG_RUNTIME_DIR"):
        bases.append(os.path.join(os.environ["XDG_RUNTIME_DIR"], "memsight"))
    for root in ("/dev/shm", os.environ.get("TMPDIR") or "/tmp"):
        bases.append(f"{root}/memsight-{uid}")
    bases.append(os.path.expanduser("~/.cache/memsight/runtime"))
    found = []
    for b in bases:
        found.extend(glob.glob(os.path.join(b, f"sidecar-{pid}.*.sock")))
        found.extend(glob.glob(os.path.join(b, f"sidecar-{pid}.sock")))
    return found


class SidecarSamples:
    """The live socket of the sidecar watching this process (`memsight run` or `attach`): waits
    for the samples it sends, the event a test job waits for whatever the machine's load."""

    def __init__(self, deadline_s=180.0):
        import socket, time
        self.end = time.time() + deadline_s
        self.sock = None
        while self.sock is None and time.time() < self.end:
            for path in sidecar_sockets():
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.connect(path)
                except OSError:  # a stale socket: nobody listens
                    s.close()
                    continue
                s.settimeout(1.0)
                self.sock = s
                break
            else:
                time.sleep(0.05)
        self.buf, self.lines, self.skip_partial = b"", 0, False

    def wait(self, count, tree=False):
        """Blocks until `count` more snapshots (with a process tree, if asked) arrived; False when
        there is no socket or the deadline passed."""
        import json, socket, time
        if self.sock is None:
            return False
        self._skip_what_arrived()
        seen = 0
        while seen < count and time.time() < self.end:
            while b"\n" not in self.buf:
                try:
                    chunk = self.sock.recv(65536)
                except socket.timeout:
                    if time.time() >= self.end:
                        return False
                    continue
                if not chunk:
                    return False
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            self.lines += 1
            if self.lines <= 2:  # the hello and the state already held: not new samples
                continue
            if self.skip_partial:  # the rest of a record sent before the wait began
                self.skip_partial = False
                continue
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("type") == "snapshot" and (r.get("tree") or not tree):
                seen += 1
        return seen >= count


    def _skip_what_arrived(self):
        """Drops what was sent before this call (samples of an earlier state)."""
        import socket
        self.sock.settimeout(0.0)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                self.buf += chunk
        except (BlockingIOError, socket.timeout):
            pass
        finally:
            self.sock.settimeout(1.0)
        while b"\n" in self.buf:
            _, self.buf = self.buf.split(b"\n", 1)
            self.lines += 1
        # A partial line left is the start of a record sent before this call: skip it too.
        if self.buf:
            self.skip_partial = True


def wait_for_tree_samples(count, deadline_s=180.0):
    """Blocks until the sidecar has sent `count` new process-tree samples; False without one."""
    return SidecarSamples(deadline_s).wait(count, tree=True)


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
