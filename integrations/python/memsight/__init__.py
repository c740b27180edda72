"""memsight for Python jobs: mark training steps and phases, read the memory snapshot.

Under ``memsight run -- python train.py`` the job already carries memsight's preloaded library
(heap counted exactly, flight recorder, report); this package only talks to it::

    import memsight
    for n, batch in enumerate(loader):
        memsight.step(n)
        with memsight.phase("forward"):
            loss = model(batch)

Outside ``memsight run`` (or in a forked DataLoader worker) every call is a no-op and
``memsight.active()`` is False, so a script runs unchanged with or without memsight.
"""

import ctypes
import functools
import json

__all__ = ["active", "step", "phase", "snapshot", "ABI_VERSION"]

#: The preloaded library's interface this package speaks.
ABI_VERSION = 1


def _load():
    """The preloaded library, or None when this process does not carry it."""
    try:
        lib = ctypes.CDLL(None)
        version = lib.memsight_abi_version
    except (OSError, AttributeError):
        return None
    version.restype = ctypes.c_uint32
    if version() != ABI_VERSION:
        import warnings

        warnings.warn(
            "memsight: the preloaded library speaks interface %d, this package %d; "
            "steps and phases are not recorded" % (version(), ABI_VERSION)
        )
        return None
    lib.memsight_active.restype = ctypes.c_int
    lib.memsight_step.argtypes = [ctypes.c_uint64]
    lib.memsight_step.restype = None
    lib.memsight_phase_enter.argtypes = [ctypes.c_char_p]
    lib.memsight_phase_enter.restype = ctypes.c_void_p
    lib.memsight_phase_exit.argtypes = [ctypes.c_void_p]
    lib.memsight_phase_exit.restype = None
    lib.memsight_snapshot_json.argtypes = []
    lib.memsight_snapshot_json.restype = ctypes.c_void_p
    lib.memsight_string_free.argtypes = [ctypes.c_void_p]
    lib.memsight_string_free.restype = None
    for name in ("memsight_device_push", "memsight_device_absent"):
        f = getattr(lib, name)
        f.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        f.restype = ctypes.c_int
    lib.memsight_device_oom.argtypes = [ctypes.c_char_p]
    lib.memsight_device_oom.restype = ctypes.c_int
    for name in ("memsight_device_lines", "memsight_python_arenas"):
        f = getattr(lib, name, None)  # a library older than the package: absent
        if f is not None:
            f.argtypes = [ctypes.c_char_p]
            f.restype = ctypes.c_int
    end = getattr(lib, "memsight_training_end", None)  # a library older than the package: absent
    if end is not None:
        end.argtypes = []
        end.restype = ctypes.c_int
    return lib


_lib = _load()

#: Whether the job marks steps / phases itself (its own calls take over from the automatic ones).
_explicit = {"steps": False, "phases": False}


def active():
    """True when this process's steps and phases reach a memsight session."""
    return _lib is not None and _lib.memsight_active() == 1


def step(n):
    """Marks the start of training step ``n`` (an int >= 0)."""
    n = int(n)
    if n < 0:
        raise ValueError("memsight.step: the step is a count from 0, got %d" % n)
    _explicit["steps"] = True
    if _lib is not None:
        _lib.memsight_step(n)


class phase:
    """A phase of the step, as a context manager or a decorator; nestable ("train/forward").

    >>> with memsight.phase("forward"):
    ...     out = model(x)
    """

    __slots__ = ("name", "_handles")

    def __init__(self, name):
        self.name = str(name)
        self._handles = []

    def __enter__(self):
        _explicit["phases"] = True
        handle = None
        if _lib is not None:
            handle = _lib.memsight_phase_enter(self.name.encode("utf-8"))
        self._handles.append(handle)
        return self

    def __exit__(self, *exc):
        handle = self._handles.pop()
        if handle:
            _lib.memsight_phase_exit(handle)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with phase(self.name):
                return fn(*args, **kwargs)

        return wrapped


def _training_end():
    """Ends the training window: what follows is the ``shutdown`` phase (see memsight._startup)."""
    end = getattr(_lib, "memsight_training_end", None)
    if end is not None:
        end()


def snapshot():
    """The memory snapshot now (the report's snapshot type, as a dict), or None without a session.

    ``snapshot()["heap"]["live_bytes"]`` is the process heap (every malloc of the process);
    ``["host"]`` holds RSS and its parts, ``["devices"]`` what device sources report.
    """
    if _lib is None:
        return None
    p = _lib.memsight_snapshot_json()
    if not p:
        return None
    try:
        return json.loads(ctypes.string_at(p).decode("utf-8"))
    finally:
        _lib.memsight_string_free(p)


_refused = set()


def _checked(call, rc):
    """Warns once per call kind when the library refused a record (a shape it does not know)."""
    if rc != 0 and call not in _refused:
        import warnings

        _refused.add(call)
        warnings.warn("memsight: the preloaded library refused a %s record (not the report's "
                      "shape); later ones are dropped silently" % call, RuntimeWarning)


def _device_push(source, samples):
    """Sends this moment's samples of device source ``source`` (a list of dicts)."""
    if _lib is not None:
        _checked("device sample", _lib.memsight_device_push(source.encode(), json.dumps(samples).encode()))


def _device_absent(source, why):
    """Records that device source ``source`` gives nothing here, and why."""
    if _lib is not None:
        _checked("device status", _lib.memsight_device_absent(source.encode(), why.encode()))


def _device_oom(oom):
    """Records a device out-of-memory (a dict in the report's device OOM shape)."""
    if _lib is not None:
        _checked("device OOM", _lib.memsight_device_oom(json.dumps(oom).encode()))


def _device_lines_push(lines):
    """Records a device's allocated memory at its peak by Python line (the report's device-lines
    shape; memsight/_device_lines.py builds it)."""
    f = getattr(_lib, "memsight_device_lines", None)
    if f is not None:
        _checked("device lines", f(json.dumps(lines).encode()))


def _python_arenas_push(arenas):
    """Records Python's small-object arenas as CPython counts them (memsight/_pymalloc.py)."""
    f = getattr(_lib, "memsight_python_arenas", None)
    if f is not None:
        _checked("Python arenas", f(json.dumps(arenas).encode()))


def _python_frames():
    """Lets the heap sampler read this interpreter's frames (the preloaded library's
    ``memsight_python_frames``, which checks itself on this very frame); warns once why not."""
    f = getattr(_lib, "memsight_python_frames", None)  # a library older than the package: absent
    if f is None:
        return False
    f.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    f.restype = ctypes.c_int
    why = ctypes.c_void_p()
    if f(b"_python_frames", ctypes.byref(why)):
        return True
    if why.value:
        import warnings

        warnings.warn("memsight: allocation sites without Python lines: "
                      + ctypes.string_at(why.value).decode("utf-8", "replace"))
        _lib.memsight_string_free(why.value)
    return False


def _python_frames_off():
    """The interpreter is exiting: the sampler stops reading its frames."""
    f = getattr(_lib, "memsight_python_frames_off", None)
    if f is not None:
        f.argtypes = []
        f.restype = None
        f()
