"""What ``memsight run`` does in every Python process of the job as the interpreter starts (through
the ``sitecustomize`` it puts first on ``PYTHONPATH``), before the job's own code runs:

- runs the ``sitecustomize`` it hides (the environment's own, if any), so nothing of the
  environment's start-up is lost;
- when the job imports torch, installs ``memsight.torch`` (device memory; the report then knows
  the job uses PyTorch) and the automatic steps and phases (``memsight._auto``), unless
  ``MEMSIGHT_AUTO_STEPS=0`` (``memsight run --no-auto-steps``);
- when the interpreter starts to exit, ends the training window: what follows is the ``shutdown``
  phase, which budgets do not gate by default; and reads Python's small-object arenas (pymalloc,
  outside the heap count) with their exact peak for the report (``memsight._pymalloc``).

Nothing here runs outside a process that carries memsight's preloaded library.
"""

import os
import sys


def _run_hidden_sitecustomize():
    """Imports the next ``sitecustomize`` on ``sys.path`` after this one's directory."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the interpreter reports a failing sitecustomize the same way
        print("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s: %s"
              % (type(e).__name__, e), file=sys.stderr)


class _AfterImport:
    """A meta-path finder that runs ``then(module)`` once ``name`` has been imported, then leaves."""

    def __init__(self, name, then):
        self.name = name
        self.then = then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                break
        if spec is None or spec.loader is None:
            return spec
        loader, then = spec.loader, self.then

        class _Loader:
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                then(module)

        spec.loader = _Loader()
        return spec


def _torch_imported(torch):
    """The job imported torch: its device memory (``memsight.torch``, which says why a CPU-only
    job has none, and so tells the report the job uses PyTorch) and, unless turned off, the
    automatic steps and phases."""
    import warnings

    import memsight

    if "memsight.torch" in sys.modules and not getattr(sys.modules["memsight.torch"], "_imported", False):
        # The job's own `import memsight.torch` is what imports torch: that module is half run
        # (its `install` not yet defined), so it installs itself as its import ends.
        memsight._install_torch_when_imported = True
    else:
        try:
            import memsight.torch

            memsight.torch.install()
        except Exception as e:
            warnings.warn("memsight: PyTorch's device memory is not recorded (%s: %s)" % (type(e).__name__, e))
    if os.environ.get("MEMSIGHT_AUTO_STEPS", "1") == "0":
        return
    from memsight import _auto

    try:
        memsight._auto_state = _auto.install(torch, memsight._lib, memsight._explicit)
    except Exception as e:  # a torch this code does not know: the job runs on, without them
        warnings.warn("memsight: automatic steps and phases are off (%s: %s)" % (type(e).__name__, e))


def _training_ends():
    import memsight

    memsight._python_frames_off()
    state = getattr(memsight, "_auto_state", None)
    if state is not None:
        state.close()  # whatever phase of ours is open
    memsight._training_end()
    try:
        from memsight import _pymalloc

        arenas = _pymalloc.stats()
        if arenas is not None:
            memsight._python_arenas_push(arenas)
    except Exception:  # an interpreter this code does not know: the report goes without them
        pass


def _on_exit(fn):
    """Runs ``fn`` as the interpreter starts to exit: before the job's own ``atexit`` handlers
    (threading's exit hooks run first), else as the last of them."""
    import threading

    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(fn)
            return
        except Exception:
            pass
    import atexit

    atexit.register(fn)


def start():
    _run_hidden_sitecustomize()
    try:
        import memsight
    except Exception:
        return
    if not memsight.active():
        return
    memsight._python_frames()
    if "torch" in sys.modules:
        _torch_imported(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _AfterImport("torch", _torch_imported))
    _on_exit(_training_ends)
