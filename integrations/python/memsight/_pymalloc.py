"""Python's small-object allocator (pymalloc) in memsight's report. Objects of 512 bytes or less
live in pymalloc's arenas (1 MiB each since CPython 3.10, 256 KiB before), which it takes from the
system with ``mmap``, not ``malloc``: the preloaded library's heap count (the malloc family) does
not see them. CPython keeps its own exact count, and this module reads it:
``_PyObject_DebugMallocStats`` (what ``sys._debugmallocstats()`` prints), written into memory with
``open_memstream`` instead of to standard error, gives the arenas allocated now, their high-water
mark (the most allocated at once: an exact peak, however briefly it lasted), their size and the
bytes in allocated blocks. One read walks pymalloc's pools (about a millisecond per GiB of
arenas) with the GIL held; the package reads it once as the interpreter exits.

A build without pymalloc (``PYTHONMALLOC=malloc``, the free-threaded 3.13t's mimalloc) prints no
arena lines: it is reported as absent, and its small objects are in the heap count already.
"""

import ctypes
import re

_ROWS = {
    "arenas_allocated": re.compile(rb"^# arenas allocated current\s*=\s*([\d,]+)", re.M),
    "arenas_peak": re.compile(rb"^# arenas highwater mark\s*=\s*([\d,]+)", re.M),
    "allocated_blocks_bytes": re.compile(rb"^# bytes in allocated blocks\s*=\s*([\d,]+)", re.M),
    "arena_total": re.compile(rb"^(\d[\d,]*) arenas \* (\d[\d,]*) bytes/arena", re.M),
}


def _number(text):
    return int(text.replace(b",", b""))


def parse(text):
    """The figures of one ``_PyObject_DebugMallocStats`` text, or None when it has no arenas
    (no pymalloc). ``arena_size_bytes`` comes from its ``N arenas * S bytes/arena`` line, else
    from its arena total over the arenas allocated."""
    found = {k: r.search(text) for k, r in _ROWS.items()}
    if found["arenas_allocated"] is None or found["arenas_peak"] is None:
        return None
    out = {
        "arenas": _number(found["arenas_allocated"].group(1)),
        "peak_arenas": _number(found["arenas_peak"].group(1)),
    }
    if found["allocated_blocks_bytes"] is not None:
        out["allocated_blocks_bytes"] = _number(found["allocated_blocks_bytes"].group(1))
    size = None
    if found["arena_total"] is not None:
        size = _number(found["arena_total"].group(2))
    else:
        # "Total = B" right after the bytes-lost rows is the arenas' size in all.
        m = re.search(rb"arena alignment\s*=\s*[\d,]+\s*\nTotal\s*=\s*([\d,]+)", text)
        if m is not None and out["arenas"] > 0:
            size = _number(m.group(1)) // out["arenas"]
    if size is None:
        return None
    out["arena_size_bytes"] = size
    out["bytes"] = out["arenas"] * size
    out["peak_bytes"] = out["peak_arenas"] * size
    return out


def _stats_text():
    """``_PyObject_DebugMallocStats``'s text, written to memory; None where it cannot be had."""
    libc = ctypes.CDLL(None)
    api = ctypes.pythonapi
    stats = getattr(api, "_PyObject_DebugMallocStats", None)
    open_memstream = getattr(libc, "open_memstream", None)
    if stats is None or open_memstream is None:
        return None
    buf, size = ctypes.c_void_p(), ctypes.c_size_t()
    open_memstream.restype = ctypes.c_void_p
    open_memstream.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
    stream = open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not stream:
        return None
    stats.argtypes = [ctypes.c_void_p]
    stats.restype = ctypes.c_int
    try:
        written = stats(stream)  # pythonapi holds the GIL: pymalloc cannot change meanwhile
    finally:
        libc.fclose.argtypes = [ctypes.c_void_p]
        libc.fclose(ctypes.c_void_p(stream))
    try:
        return ctypes.string_at(buf, size.value) if written and buf.value else b""
    finally:
        libc.free.argtypes = [ctypes.c_void_p]
        libc.free(buf)


def stats():
    """pymalloc's arenas now and at their peak (``arenas``, ``peak_arenas``, ``arena_size_bytes``,
    ``bytes``, ``peak_bytes``, ``allocated_blocks_bytes``), or None without pymalloc."""
    text = _stats_text()
    return parse(text) if text else None
