"""Device memory by Python line: attributes the live bytes of one CUDA device, as PyTorch's own
allocator history records them (``torch.cuda.memory._snapshot()`` after
``torch.cuda.memory._record_memory_history(stacks="python")``), to the lines of the job that
allocated them — at the allocator's peak (replayed from the history) or now (at an OOM).

Everything here is a pure function of the snapshot dict, so it runs (and is tested) without a GPU.
The dict is the one ``torch._C._cuda_memorySnapshot`` builds (torch/csrc/cuda/Module.cpp):

- ``segments``: one per ``cudaMalloc``; each has ``device`` and ``blocks``, and each block
  ``address``, ``size`` (rounded), ``requested_size``, ``state`` (``active_allocated``,
  ``active_pending_free`` or ``inactive``) and ``frames`` (the stack that allocated it, innermost
  first; empty when it was allocated before the history was on);
- ``device_traces``: one list per device, oldest first, of the allocator's actions (``alloc``,
  ``free_requested``, ``free_completed``, ``segment_alloc``, ``segment_free``, ``segment_map``,
  ``segment_unmap``, ``oom``, ``snapshot``), each with ``addr`` (``device_free`` for ``oom``),
  ``size``, ``stream``, ``time_us`` and, when recorded, ``frames``. It is a ring of the last
  ``max_entries`` actions. An ``alloc``'s and a ``free_requested``'s ``size`` is the size asked
  for (the allocator's ``orig_size``: the block's ``requested_size``), not the rounded block.

So the bytes here are the bytes asked for, as the allocator's ``requested_bytes`` statistic counts
them: a block counts from its ``alloc`` to its ``free_requested`` (an ``active_pending_free`` block
is no longer allocated), and the replayed peak equals ``torch.cuda.memory_stats()
["requested_bytes.all.peak"]`` when the history reaches back to it (``max_memory_allocated`` is
higher by the rounding, at most 511 bytes a block with the default settings).

Categories come from the frames alone, by which part of PyTorch was running (``CATEGORY_RULES``):
the first rule that matches any frame, innermost first, names the block's category. A block the
history saw allocated without frames was allocated on a thread that runs no Python: with
``stacks="python"`` that is autograd's device thread (the backward pass: gradients and their
temporaries), so its category is ``backward``; a block with no frames that the history did not see
allocated predates it (``before history``).
"""

import os

#: Most lines kept per moment (the rest are summed into ``other_lines_bytes``).
TOP_LINES = 10
#: Most frames kept in a line's stack (innermost first).
STACK_DEPTH = 12

#: (category, path part, function names or None for any): a block is in the first category whose
#: path part appears in one of its frames' file (with "/" separators) and whose function matches.
#: Checked innermost frame first, rule by rule: the optimizer's step and the autograd engine are
#: found below the user's line, module construction and forward above the tensor op. What the
#: frames cannot tell apart stays together: "optimizer state" holds the step's temporaries too
#: (SGD creates its momentum buffers inside the step), "activations" a forward's temporaries.
CATEGORY_RULES = (
    ("optimizer state", "/torch/optim/", None),
    ("gradients", "/torch/autograd/", None),
    ("gradients", "/torch/_tensor.py", ("backward",)),
    ("parameters", "/torch/nn/parameter.py", None),
    ("parameters", "/torch/nn/modules/", ("__init__", "reset_parameters", "_apply", "to", "cuda")),
    ("parameters", "/torch/nn/init.py", None),
    ("activations", "/torch/nn/", None),
    ("activations", "", ("forward", "_call_impl", "_wrapped_call_impl")),
)

ALLOCATED = "active_allocated"


def _frames(entry):
    frames = entry.get("frames") if isinstance(entry, dict) else None
    return frames if isinstance(frames, list) else []


def _int(value):
    if type(value) is int:
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def live_blocks(snapshot, device):
    """``{address: (size, frames, seen)}`` of the blocks allocated on ``device`` now; ``seen`` is
    False here (``replay_peak`` and ``device_lines`` mark those the history saw allocated)."""
    live = {}
    for seg in snapshot.get("segments") or ():
        if not isinstance(seg, dict) or _int(seg.get("device", 0)) != device:
            continue
        for block in seg.get("blocks") or ():
            if not isinstance(block, dict) or block.get("state") != ALLOCATED:
                continue
            addr = _int(block.get("address"))
            size = _int(block.get("requested_size", block.get("size")))
            if addr is not None and size is not None:
                live[addr] = (size, _frames(block), False)
    return live


def _trace(snapshot, device):
    traces = snapshot.get("device_traces") or []
    if not isinstance(traces, list) or not 0 <= device < len(traces):
        return []
    return [e for e in traces[device] or () if isinstance(e, dict)]


def _undo_to_start(live, trace):
    """The blocks allocated before the first action of ``trace``, from those allocated now. A block
    freed in the window whose allocation is older than it has the free's size and no frames."""
    state = dict(live)
    for e in reversed(trace):
        action, addr = e.get("action"), _int(e.get("addr"))
        if addr is None:
            continue
        if action == "alloc":
            state.pop(addr, None)
        elif action == "free_requested":
            size = _int(e.get("size"))
            if size is not None:
                state[addr] = (size, [], False)
    return state


def replay_peak(snapshot, device):
    """The blocks allocated on ``device`` at the highest point of its history, and facts about it:
    ``(blocks, {"peak_bytes", "entries", "at_time_us", "window_start_bytes"})``. Without a history
    (``enabled="state"``, or none recorded) the peak is now."""
    live = live_blocks(snapshot, device)
    trace = _trace(snapshot, device)
    if not trace:
        return live, {"peak_bytes": sum(b[0] for b in live.values()), "entries": 0}
    state = _undo_to_start(live, trace)
    cur = start = sum(b[0] for b in state.values())
    best, best_i = cur, -1
    sizes = {a: b[0] for a, b in state.items()}
    for i, e in enumerate(trace):
        action, addr = e.get("action"), _int(e.get("addr"))
        if addr is None:
            continue
        if action == "alloc":
            size = _int(e.get("size")) or 0
            cur += size - sizes.get(addr, 0)
            sizes[addr] = size
            if cur > best:
                best, best_i = cur, i
        elif action == "free_requested":
            cur -= sizes.pop(addr, 0)
    blocks = dict(state)
    for e in trace[: best_i + 1]:
        action, addr = e.get("action"), _int(e.get("addr"))
        if addr is None:
            continue
        if action == "alloc":
            blocks[addr] = (_int(e.get("size")) or 0, _frames(e), True)
        elif action == "free_requested":
            blocks.pop(addr, None)
    # Blocks allocated now that the history saw allocated at the peak carry the block's frames
    # when the trace entry had none (context="state").
    for addr, (size, frames, seen) in list(blocks.items()):
        if not frames and addr in live and live[addr][0] == size and live[addr][1]:
            blocks[addr] = (size, live[addr][1], seen)
    facts = {"peak_bytes": best, "entries": len(trace), "window_start_bytes": start}
    if best_i >= 0:
        t = _int(trace[best_i].get("time_us"))
        if t is not None:
            facts["at_time_us"] = t
    return blocks, facts


def default_library_paths():
    """Where installed code lives (the standard library, site-packages): frames there are not the
    job's own lines."""
    import sysconfig

    paths = set()
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(name)
        if p:
            paths.add(os.path.realpath(p))
    return tuple(sorted(paths))


def is_user_frame(frame, library_paths, memo=None):
    """A frame of the job's own Python code: a ``.py`` file outside ``library_paths``. ``memo``
    (a dict) keeps the answer per file name: a history repeats the same few files."""
    filename = frame.get("filename") or ""
    if memo is not None and filename in memo:
        return memo[filename]
    user = False
    if filename.endswith(".py"):
        real = os.path.realpath(filename) if os.path.isabs(filename) else filename
        user = not any(real == p or real.startswith(p + os.sep) for p in library_paths)
    if memo is not None:
        memo[filename] = user
    return user


def category(frames, seen=True):
    """The block's category by ``CATEGORY_RULES``, or ``"other"`` (no PyTorch part recognised).
    Without frames: ``"backward"`` when the history saw it allocated (a thread without Python:
    autograd's), else ``"before history"``."""
    if not frames:
        return "backward" if seen else "before history"
    for name, part, functions in CATEGORY_RULES:
        for f in frames:
            filename = (f.get("filename") or "").replace(os.sep, "/")
            if part and part not in filename:
                continue
            if functions is None or f.get("name") in functions:
                return name
    return "other"


def frame_text(frame):
    """``file:line function`` of one frame, as the report's stacks carry it."""
    return "%s:%s %s" % (frame.get("filename") or "?", frame.get("line", 0), frame.get("name") or "?")


def _line_of(frames, library_paths, memo=None):
    """The job's line that allocated a block: its first own frame from the innermost, else the
    innermost frame; None without frames."""
    for f in frames:
        if is_user_frame(f, library_paths, memo):
            return f
    return frames[0] if frames else None


def attribute(blocks, library_paths=None, top=TOP_LINES, depth=STACK_DEPTH):
    """Groups ``{address: (size, frames, seen)}`` by allocating line: the report's ``lines``,
    ``categories``, ``live_bytes``, ``no_stack_bytes`` (blocks without frames, whose categories
    say why) and ``other_lines_bytes`` (lines below the top ``top``)."""
    if library_paths is None:
        library_paths = default_library_paths()
    by_line = {}
    categories = {}
    memo = {}
    live = unattributed = 0
    for size, frames, seen in blocks.values():
        live += size
        cat = category(frames, seen)
        categories[cat] = categories.get(cat, 0) + size
        f = _line_of(frames, library_paths, memo)
        if f is None:
            unattributed += size
            continue
        key = (f.get("filename") or "?", _int(f.get("line")) or 0, f.get("name") or "?")
        g = by_line.get(key)
        if g is None:
            g = by_line[key] = {"bytes": 0, "blocks": 0, "cats": {}, "largest": -1, "stack": []}
        g["bytes"] += size
        g["blocks"] += 1
        g["cats"][cat] = g["cats"].get(cat, 0) + size
        if size > g["largest"]:
            g["largest"], g["stack"] = size, [frame_text(x) for x in frames[:depth]]
    ranked = sorted(by_line.items(), key=lambda kv: (-kv[1]["bytes"], kv[0]))
    lines = []
    for (filename, line, function), g in ranked[:top]:
        lines.append({
            "file": filename,
            "line": line,
            "function": function,
            "bytes": g["bytes"],
            "blocks": g["blocks"],
            "category": max(sorted(g["cats"].items()), key=lambda kv: kv[1])[0],
            "stack": g["stack"],
        })
    shown = sum(l["bytes"] for l in lines)
    return {
        "live_bytes": live,
        "no_stack_bytes": unattributed,
        "other_lines_bytes": live - unattributed - shown,
        "lines": lines,
        "categories": [
            {"name": n, "bytes": b} for n, b in sorted(categories.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
    }


def failed_request(snapshot, device, library_paths=None, depth=STACK_DEPTH):
    """The request an OOM refused, from the history's last ``oom`` action on ``device``: its line
    (as in ``lines``) with ``bytes`` the size asked for; None when the history has none."""
    if library_paths is None:
        library_paths = default_library_paths()
    for e in reversed(_trace(snapshot, device)):
        if e.get("action") != "oom":
            continue
        frames = _frames(e)
        f = _line_of(frames, library_paths) or {}
        return {
            "file": f.get("filename") or "?",
            "line": _int(f.get("line")) or 0,
            "function": f.get("name") or "?",
            "bytes": _int(e.get("size")) or 0,
            "blocks": 1,
            "category": category(frames),
            "stack": [frame_text(x) for x in frames[:depth]],
        }
    return None


def device_lines(snapshot, device, moment, allocator_peak_bytes=None, library_paths=None, top=TOP_LINES):
    """The report's device-lines record for ``device`` at ``moment`` (``"peak"``: the highest point
    the history holds; ``"oom"`` or ``"now"``: the blocks allocated now, with the refused request
    at an OOM). ``allocator_peak_bytes`` (the allocator's own peak of requested bytes) says whether
    the history reached back to it: ``covers_peak``."""
    if not isinstance(snapshot, dict):
        raise TypeError("a torch.cuda.memory._snapshot() dict, not %s" % type(snapshot).__name__)
    device = int(device)
    if moment == "peak":
        blocks, facts = replay_peak(snapshot, device)
    else:
        blocks = live_blocks(snapshot, device)
        trace = _trace(snapshot, device)
        facts = {"entries": len(trace)}
        # The blocks whose allocation the history holds: only their latest action on the address
        # counts (an address is reused).
        last = {}
        for e in trace:
            addr = _int(e.get("addr"))
            if addr is not None and e.get("action") in ("alloc", "free_requested"):
                last[addr] = e.get("action")
        for addr, (size, frames, _) in list(blocks.items()):
            if last.get(addr) == "alloc":
                blocks[addr] = (size, frames, True)
    out = {"device": device, "moment": moment}
    out.update(attribute(blocks, library_paths, top))
    out["history_entries"] = facts.get("entries", 0)
    if allocator_peak_bytes is not None:
        out["allocator_peak_bytes"] = int(allocator_peak_bytes)
        if moment == "peak":
            out["covers_peak"] = out["live_bytes"] >= int(allocator_peak_bytes)
    if moment == "oom":
        failed = failed_request(snapshot, device, library_paths)
        if failed is not None:
            out["failed_request"] = failed
    return out
