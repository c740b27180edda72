"""PyTorch's device memory in memsight's report: the CUDA caching allocator's statistics per device
(backend ``torch-cuda``), NVML's view of each device and of every process on it (``nvml``), and
CUDA out-of-memory errors caught the moment the allocator raises them::

    import memsight.torch
    memsight.torch.install()          # once, anywhere before or in the training loop

A daemon thread reads the statistics every ``interval`` seconds and hands them to the session,
whose sampler takes the latest at each of its samples. Where a source cannot work (a CPU-only
torch, no GPU, no NVIDIA driver) the report lists it as absent with the reason. Nothing here
raises into the training loop: a failure is reported once as a warning and that part stops.

This module never initialises CUDA itself: the allocator is read only once the job has started
CUDA (``torch.cuda.is_initialized()``), the OOM observer is attached then, and free/total memory
is asked only of devices the allocator has already reserved memory on (asking another device
would create a CUDA context there, about 500 MiB, in every process of a multi-GPU job).

With ``device_history`` (``memsight run --device-history``, ``MEMSIGHT_DEVICE_HISTORY=1``) it also
turns on PyTorch's allocator history with Python stacks as CUDA starts (before the job's first
device allocation), bounded to ``MEMSIGHT_DEVICE_HISTORY_ENTRIES`` actions (100000), and says
which Python lines hold the device memory: at each device's peak (read again whenever the
allocator's own peak has grown 5% since, at most every 0.5 s unless it doubled, and at the end)
and at an OOM (memsight/_device_lines.py).
"""

import atexit
import os
import threading
import time
import traceback
import warnings

import torch

import memsight
from memsight import _device_lines, _nvml

__all__ = ["install"]

_lock = threading.Lock()
_poller = None
_warned = set()
#: CUDA devices the allocator has reserved memory on: they have a CUDA context.
_contexts = set()


#: Actions PyTorch's allocator history keeps (a ring; each costs a few hundred bytes of host memory).
HISTORY_ENTRIES = 100_000
#: The allocator's peak must grow by this share before the lines at the peak are read again...
PEAK_GROWTH = 0.05
#: ...and this many seconds must have passed since the last read, unless the peak doubled (the
#: same rule as the heap's peak profile, MEMSIGHT_HEAP_PEAK_EVERY_MS): a job loading a model grows
#: its peak in many small steps, and each read copies the whole history into Python.
READ_EVERY = 0.5


def _history_wanted(device_history):
    if device_history is not None:
        return bool(device_history)
    return os.environ.get("MEMSIGHT_DEVICE_HISTORY", "0") not in ("", "0")


def _history_entries():
    raw = os.environ.get("MEMSIGHT_DEVICE_HISTORY_ENTRIES")
    try:
        n = int(raw) if raw else HISTORY_ENTRIES
    except ValueError:
        n = 0
    if n <= 0:
        warnings.warn("memsight: MEMSIGHT_DEVICE_HISTORY_ENTRIES=%r cannot be used (a count > 0); "
                      "keeping %d" % (raw, HISTORY_ENTRIES), RuntimeWarning)
        n = HISTORY_ENTRIES
    return n


def install(interval=0.1, device_history=None):
    """Starts reporting PyTorch's device memory to memsight; returns ``{source: detail}``.

    Call it once the job is set up (calling it again returns the first call's answer). Without
    a memsight session (``memsight.active()`` False) it does nothing and returns ``{}``.
    ``interval`` is the seconds between two reads of the statistics. ``device_history`` turns on
    the device memory by Python line (None: ``MEMSIGHT_DEVICE_HISTORY``); it starts with CUDA, so
    call ``install`` before the job's first CUDA tensor for every allocation to have its line.
    """
    global _poller
    if not interval > 0:
        raise ValueError("memsight.torch.install: interval must be > 0 seconds, not %r" % (interval,))
    with _lock:
        if _poller is None:
            if not memsight.active():
                return {}
            _poller = _Poller(float(interval), _history_wanted(device_history))
            _poller.start()
        return dict(_poller.status)


def _warn_once(what, err):
    """Reports a failed part once (it is then left off); never raises."""
    if what in _warned:
        return
    _warned.add(what)
    warnings.warn(
        "memsight: %s failed (%s: %s); memsight goes on without it" % (what, type(err).__name__, err),
        RuntimeWarning,
        stacklevel=2,
    )


def cuda_absence():
    """Why the CUDA allocator gives nothing in this process, or None when it can."""
    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return (
            "torch.cuda.is_available() is False: torch %s is a CPU-only build "
            "(no CUDA support compiled in)" % torch.__version__
        )
    built = "CUDA %s" % torch.version.cuda if torch.version.cuda else "ROCm %s" % torch.version.hip
    return (
        "torch.cuda.is_available() is False: torch %s is built with %s but sees no device "
        "(no GPU, no driver, or CUDA_VISIBLE_DEVICES hides them)" % (torch.__version__, built)
    )


def _stat(stats, name, kind="current"):
    """``name.all.kind`` from the allocator's nested statistics, or None."""
    try:
        return int(stats[name]["all"][kind])
    except (KeyError, TypeError):
        return None


def cuda_samples(names=None):
    """The caching allocator's statistics of every device, as memsight device samples.

    Empty until the job has initialised CUDA. ``names`` caches device names by index.
    """
    if not torch.cuda.is_initialized():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        stats = torch.cuda.memory_stats_as_nested_dict(i)
        if not stats:
            continue
        s = {
            "index": i,
            "backend": "torch-cuda",
            "allocated_bytes": _stat(stats, "allocated_bytes"),
            "reserved_bytes": _stat(stats, "reserved_bytes"),
            "active_bytes": _stat(stats, "active_bytes"),
            "inactive_split_bytes": _stat(stats, "inactive_split_bytes"),
            "requested_bytes": _stat(stats, "requested_bytes"),
            "peak_allocated_bytes": _stat(stats, "allocated_bytes", "peak"),
            "peak_reserved_bytes": _stat(stats, "reserved_bytes", "peak"),
            "alloc_retries": stats.get("num_alloc_retries"),
            "ooms": stats.get("num_ooms"),
        }
        if names is not None:
            if i not in names:
                names[i] = torch.cuda.get_device_name(i)
            s["name"] = names[i]
        # Only a device the allocator has used surely has a context: mem_get_info would create one.
        if (s["reserved_bytes"] or 0) > 0 or (s["peak_reserved_bytes"] or 0) > 0:
            _contexts.add(i)
        if i in _contexts:
            free, total = torch.cuda.mem_get_info(i)
            s.update(free_bytes=int(free), total_bytes=int(total))
        out.append({k: v for k, v in s.items() if v is not None})
    return out


def largest_free_block(device):
    """The largest free (inactive) block in the allocator's segments of ``device``, or None."""
    largest = None
    for seg in torch.cuda.memory_snapshot(include_traces=False):
        if seg.get("device") != device:
            continue
        for block in seg.get("blocks", ()):
            if block.get("state") == "inactive":
                largest = max(largest or 0, int(block["size"]))
    return largest


def _current_stack():
    """The calling thread's Python stack as snapshot frames, innermost first, without this
    module's own frames."""
    here = os.path.abspath(__file__)
    frames = []
    for f in reversed(traceback.extract_stack()):
        if os.path.abspath(f.filename) == here:
            continue
        frames.append({"filename": f.filename, "line": f.lineno or 0, "name": f.name})
    return frames


def oom_lines(device, requested, library_paths=None):
    """The device memory allocated at an OOM by Python line, and the failed request's line (the
    history's ``oom`` action, else the stack of the thread that hit it: the observer runs there)."""
    snapshot = torch.cuda.memory._snapshot()
    lines = _device_lines.device_lines(snapshot, device, "oom", library_paths=library_paths)
    if "failed_request" not in lines:
        frames = _current_stack()
        paths = library_paths if library_paths is not None else _device_lines.default_library_paths()
        f = _device_lines._line_of(frames, paths) or {}
        lines["failed_request"] = {
            "file": f.get("filename") or "?",
            "line": f.get("line") or 0,
            "function": f.get("name") or "?",
            "bytes": int(requested),
            "blocks": 1,
            "category": _device_lines.category(frames),
            "stack": [_device_lines.frame_text(x) for x in frames[: _device_lines.STACK_DEPTH]],
        }
    return lines


def oom_record(device, requested, total, free, nvml=None):
    """The device OOM record for the allocator's OOM observer arguments, as memsight's Rust shim
    fills it: the allocator's statistics and largest free block at that moment, and NVML's
    processes on the device when NVML is loaded. ``total`` is the observer's third argument (the
    device's total, or the allowed maximum under ``set_per_process_memory_fraction``)."""
    oom = {
        "t_ms": 0,  # time, step and phase are filled in by the session
        "step": 0,
        "device": int(device),
        "requested_bytes": int(requested),
        "total_bytes": int(total),
        "free_bytes": int(free),
    }
    stats = torch.cuda.memory_stats_as_nested_dict(int(device))
    for key, name in (
        ("allocated_bytes", "allocated_bytes"),
        ("reserved_bytes", "reserved_bytes"),
        ("inactive_split_bytes", "inactive_split_bytes"),
    ):
        value = _stat(stats, name)
        if value is not None:
            oom[key] = value
    try:
        block = largest_free_block(int(device))
    except RuntimeError as e:  # the snapshot is an extra: the record goes without it
        _warn_once("the allocator snapshot at a CUDA OOM", e)
        block = None
    if block is not None:
        oom["largest_free_block_bytes"] = block
    if nvml is not None:
        oom["processes"] = nvml.processes(int(device))
    return oom


class _Poller:
    """The sources installed in this process and the thread that reads them."""

    def __init__(self, interval, history=False):
        self.interval = interval
        self.history_wanted = history
        self.history = False  # on once CUDA started and PyTorch accepted it
        self.captured = {}  # device -> the allocator peak the last lines were read at
        self.last_read = None  # time.monotonic() of the last read
        self.library_paths = _device_lines.default_library_paths()
        self.status = {}
        self.names = {}
        self.observer_attached = False
        self._stop = threading.Event()
        self._thread = None
        why = cuda_absence()
        self.cuda = why is None
        if self.cuda:
            self.status["torch-cuda"] = (
                "torch %s, %d CUDA device(s): caching-allocator statistics every %gs; "
                "OOM observer attached once CUDA starts" % (torch.__version__, torch.cuda.device_count(), interval)
            )
        else:
            self.status["torch-cuda"] = "absent: " + why
            memsight._device_absent("torch-cuda", why)
        if history:
            if self.cuda:
                self.status["torch-cuda history"] = (
                    "allocator history with Python stacks (%d actions) from CUDA's start: device "
                    "memory by line at each device's peak and at an OOM" % _history_entries())
            else:
                self.status["torch-cuda history"] = "absent: " + why
                memsight._device_absent("torch-cuda history", why)
        self.nvml = None
        try:
            self.nvml = _nvml.Nvml()
        except _nvml.NvmlError as e:
            self.status["nvml"] = "absent: %s" % e
            memsight._device_absent("nvml", str(e))
        else:
            if self.nvml.devices:
                self.status["nvml"] = "%d device(s) through libnvidia-ml (ctypes)" % len(self.nvml.devices)
            else:
                why = "NVML loaded but no device is visible to this job"
                self.status["nvml"] = "absent: " + why
                memsight._device_absent("nvml", why)
                self.nvml = None

    def start(self):
        if self.cuda and self.history_wanted:
            try:
                # Runs as soon as CUDA is initialised (at once if it is): before any allocation.
                torch.cuda._lazy_call(self._start_history)
            except Exception as e:  # noqa: BLE001 - reported once, then the lines are off
                _warn_once("turning on PyTorch's allocator history", e)
        self.tick()
        if self.cuda or self.nvml is not None:
            self._thread = threading.Thread(target=self._run, name="memsight-torch", daemon=True)
            self._thread.start()
            atexit.register(self.stop)

    def stop(self):
        """Stops the thread and pushes the final statistics (at interpreter exit)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval + 1)
        self.tick(final=True)

    def _start_history(self):
        try:
            torch.cuda.memory._record_memory_history(
                enabled="all", context="alloc", stacks="python", max_entries=_history_entries())
            self.history = True
        except Exception as e:  # noqa: BLE001 - reported once, then the lines are off
            _warn_once("turning on PyTorch's allocator history", e)

    def _read_lines(self, samples, final=False):
        """Reads the lines at the peak of each device whose allocator peak grew enough (any growth
        at the end) since they were last read, and hands them to the session."""
        now = time.monotonic()
        waited = self.last_read is None or now - self.last_read >= READ_EVERY
        due = []
        for s in samples:
            peak = s.get("peak_allocated_bytes")
            if s.get("backend") != "torch-cuda" or not peak:
                continue
            last = self.captured.get(s["index"])
            if last is None or final and peak > last or peak >= 2 * last:
                due.append((s["index"], peak))
            elif waited and peak > last * (1 + PEAK_GROWTH):
                due.append((s["index"], peak))
        if not due:
            return
        self.last_read = now
        snapshot = torch.cuda.memory._snapshot()
        for device, peak in due:
            # The history's sizes are those asked for: its peak is the allocator's requested peak.
            requested = _stat(torch.cuda.memory_stats_as_nested_dict(device), "requested_bytes", "peak")
            lines = _device_lines.device_lines(
                snapshot, device, "peak", allocator_peak_bytes=requested, library_paths=self.library_paths)
            memsight._device_lines_push(lines)
            self.captured[device] = peak

    def _run(self):
        while not self._stop.wait(self.interval):
            self.tick()

    def tick(self, final=False):
        """Reads every working source once and hands the samples to the session."""
        if self.cuda:
            samples = []
            try:
                self._attach_observer()
                samples = cuda_samples(self.names)
                memsight._device_push("torch-cuda", samples)
            except Exception as e:  # noqa: BLE001 - reported once, then this source stops
                _warn_once("reading torch.cuda.memory_stats", e)
                self.cuda = False
            if self.history:
                try:
                    self._read_lines(samples, final)
                except Exception as e:  # noqa: BLE001 - reported once, then the lines stop
                    _warn_once("reading PyTorch's allocator history", e)
                    self.history = False
        if self.nvml is not None:
            try:
                memsight._device_push("nvml", self.nvml.samples())
            except Exception as e:  # noqa: BLE001 - reported once, then this source stops
                _warn_once("reading NVML", e)
                self.nvml = None

    def _attach_observer(self):
        """Attaches the OOM observer once CUDA is initialised (attaching initialises CUDA)."""
        if self.observer_attached or not torch.cuda.is_initialized():
            return
        nvml = self.nvml
        poller = self

        def on_oom(device, alloc, total, free):
            # Runs in the thread that hit the OOM; an exception here would replace the user's
            # OutOfMemoryError, so nothing may escape.
            try:
                oom = oom_record(device, alloc, total, free, nvml)
            except Exception as e:  # noqa: BLE001
                _warn_once("recording a CUDA OOM", e)
                return
            if poller.history:
                try:
                    oom["lines"] = oom_lines(int(device), alloc, poller.library_paths)
                except Exception as e:  # noqa: BLE001 - the record goes without its lines
                    _warn_once("reading the lines at a CUDA OOM", e)
            try:
                memsight._device_oom(oom)
            except Exception as e:  # noqa: BLE001
                _warn_once("recording a CUDA OOM", e)

        torch._C._cuda_attach_out_of_memory_observer(on_oom)
        self.observer_attached = True


#: Set last: `memsight run`'s start-up (memsight/_startup.py) tells a finished import from one that
#: is running (the job's `import memsight.torch`, which imports torch).
_imported = True
if getattr(memsight, "_install_torch_when_imported", False):
    # torch was first imported from this module's own `import torch` under `memsight run`: the
    # installation `run` does on `import torch` waited for this module to be whole.
    memsight._install_torch_when_imported = False
    try:
        install()
    except Exception as e:  # noqa: BLE001 - the job runs on without its device memory
        warnings.warn("memsight: PyTorch's device memory is not recorded (%s: %s)" % (type(e).__name__, e))
