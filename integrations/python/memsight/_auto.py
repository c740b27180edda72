"""Steps and phases of an unmodified PyTorch job, from PyTorch's own global hooks and two wrappers.

``memsight run`` turns this on when the job imports torch (``--no-auto-steps`` turns it off):

- **steps** are the optimizer's: step ``k`` starts after the ``k``-th ``optimizer.step()``
  (``torch.optim.Optimizer``'s global step hooks) at the fetch of the next batch from the training
  ``DataLoader`` — one whose batches feed training forwards — or, in a loop without one, at the
  first training forward (or backward). Gradient accumulation's micro-batches fall in one step,
  a batch's loading in the step that trains on it, and several optimizers stepped per batch (a
  GAN's generator and discriminator, stepped between forwards) count once; a loop that steps an
  optimizer twice on one fetched batch gets its steps from forwards again. A job that makes no
  ``torch.optim.Optimizer`` (it updates its parameters by hand: ``p.data.add_(p.grad, ...)``)
  ends a step at each ``backward`` instead, its next starting as an update would;
- **phases**, flat and one at a time: ``forward`` (the outermost module call, per thread: a
  wrapper of ``torch.nn.Module.__call__`` — PyTorch's global module hooks would take every module
  call off its fast path, +7% of a small model's step), ``backward``
  (``torch.autograd.backward``, which ``Tensor.backward`` calls), ``optimizer`` (between the
  optimizer's global pre and post hooks; a closure's forward and backward, as Lightning runs them,
  are their own phases), ``data`` (waiting on a ``DataLoader`` iterator) and ``eval`` (from a root
  forward outside training — eval mode or no grad — until the next training forward, backward or
  optimizer step, or the fetch of a training batch).

A job's own ``memsight.step`` calls, or the framework callbacks, take over steps; its own
``memsight.phase`` takes over phases (auto phases then stop opening). Only the thread that ran the
first root forward drives them (``DataParallel``'s replicas run on threads of their own).
"""

import threading
import weakref

_tls = threading.local()


def _loader_of(iterator):
    """What a ``DataLoader`` iterator is told apart by: its loader's sampler (a new iterator per
    epoch shares it), held weakly; None when it has none."""
    sampler = getattr(iterator, "_index_sampler", None)
    try:
        return None if sampler is None else weakref.ref(sampler)
    except TypeError:
        return None


def _batches_left(iterator):
    """True when the iterator will yield another batch, False when it is spent, None when it
    cannot say (an iterable dataset has no length)."""
    try:
        return iterator._num_yielded < len(iterator)
    except (TypeError, AttributeError):
        return None


class _Auto:
    """The hooks' state: one per process."""

    def __init__(self, lib, explicit):
        self.lib = lib
        self.explicit = explicit  # {"steps": bool, "phases": bool}, set by memsight.step/phase
        self.step = -1
        self.step_pending = True
        self.open_name = None
        self.open_handle = None
        self.owner = None
        self.fetched = None  # the loader of the last batch fetched (a weak reference)
        self.training_loaders = set()  # loaders whose batches fed a training forward
        self.stepped = {}  # id of each optimizer stepped since the step began: `trained` then
        self.trained = 0  # training forwards and backwards so far
        self.paced_by_data = False  # steps start at a training batch's fetch
        self.paced_by_forwards = False  # for good: the loop updates more than once per batch
        self.optimizers_made = False  # a torch.optim.Optimizer was made: steps are its updates
        self.undo = []  # what install() did, undone in reverse by remove()

    # -- phases: at most one of ours open at a time ------------------------------------------
    def open(self, name):
        if self.open_name is not None or self.explicit["phases"]:
            return False
        handle = self.lib.memsight_phase_enter(name.encode())
        self.open_name, self.open_handle = name, handle
        return True

    def close(self, name=None):
        if self.open_name is None or (name is not None and self.open_name != name):
            return
        handle, self.open_name, self.open_handle = self.open_handle, None, None
        if handle:
            self.lib.memsight_phase_exit(handle)

    def remove(self):
        """Takes every hook and wrapper away again (the benchmark measures with and without)."""
        self.close()
        while self.undo:
            self.undo.pop()()

    # -- steps -------------------------------------------------------------------------------
    def training_event(self):
        """A training forward or backward: ends an open eval, starts the next step if due and no
        fetch started it (a loop without a training loader, or a batch from a loader not seen
        training yet: one made for each epoch), and takes the loader of the last batch fetched as
        a training one. No fetch since the last update is the same batch (a GAN's generator
        after its discriminator): no new step."""
        self.close("eval")
        self.trained += 1
        fetched = self.fetched if self.fetched is not None and self.fetched() is not None else None
        if not self.paced_by_data or (fetched is not None and fetched not in self.training_loaders):
            self.start_step()
        if fetched is not None:
            self.training_loaders.add(fetched)
            self.paced_by_data = not self.paced_by_forwards

    def start_step(self):
        if self.step_pending and not self.explicit["steps"]:
            self.step += 1
            self.step_pending = False
            self.stepped.clear()
            self.lib.memsight_step(self.step)

    def fetching(self, iterator):
        """Before a batch's fetch: a training loader's ends an open eval and starts the next step
        when one is due and a batch will come; returns whether the step is to start once the
        batch has come (the loader cannot say beforehand)."""
        loader = _loader_of(iterator)
        self.fetched = loader
        if loader is None or loader not in self.training_loaders:
            return False
        self.close("eval")
        if not (self.paced_by_data and self.step_pending):
            return False
        left = _batches_left(iterator)
        if left:
            self.start_step()
        return left is None

    def optimizer_stepping(self, optimizer):
        """Before an optimizer's step: one that already stepped in this step, with training since
        (several updates per fetched batch, or batches from elsewhere), hands step starts back to
        the forwards and starts the step it missed. A subclass's step calling its base's runs
        the hooks twice with no training between: that is one step."""
        last = self.stepped.get(id(optimizer))
        if last is not None and last != self.trained and self.paced_by_data:
            self.paced_by_data = False
            self.paced_by_forwards = True
            self.start_step()
        self.stepped[id(optimizer)] = self.trained

    def updated(self):
        """The parameters were updated (an optimizer's step, or a backward in a job that updates
        by hand): the next step starts at the next training batch's fetch or forward."""
        self.step_pending = True
        self.fetched = None  # a batch fetched before this update fed it, not the next one

    def mine(self):
        """True on the thread that drives the steps (the first to run a root forward)."""
        me = threading.get_ident()
        if self.owner is None:
            self.owner = me
        return self.owner == me


def install(torch, lib, explicit):
    """Registers the hooks on ``torch`` (already imported); returns the state, or None when this
    torch lacks the global hooks (older than 2.0)."""
    import importlib

    optim = importlib.import_module("torch.optim.optimizer")
    if not all(
        hasattr(optim, n)
        for n in ("register_optimizer_step_pre_hook", "register_optimizer_step_post_hook")
    ):
        return None
    auto = _Auto(lib, explicit)
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
    module_class = torch.nn.Module
    call = module_class.__call__

    # A module's call: PyTorch's global module hooks would do, but their mere presence takes every
    # module call of the job off PyTorch's fast path (measured: +7% of a small model's step);
    # this wrapper costs one Python call per module call and acts only on the outermost one.
    def call_with_phase(module, *args, **kwargs):
        if compiling():
            return call(module, *args, **kwargs)
        depth = getattr(_tls, "depth", 0)
        if depth:
            _tls.depth = depth + 1
            try:
                return call(module, *args, **kwargs)
            finally:
                _tls.depth = depth
        opened = False
        if auto.mine():
            if module.training and torch.is_grad_enabled():
                auto.training_event()
                opened = auto.open("forward")
            elif auto.open_name != "eval":
                auto.open("eval")
        _tls.depth = 1
        try:
            return call(module, *args, **kwargs)
        finally:
            _tls.depth = 0
            if opened:
                auto.close("forward")

    call_with_phase.__wrapped__ = call
    module_class.__call__ = call_with_phase
    undo = auto.undo
    undo.append(lambda: setattr(module_class, "__call__", call))

    def optimizer_pre(optimizer, args, kwargs):
        if not auto.mine():
            return None
        auto.close("eval")
        auto.close("forward")
        auto.optimizer_stepping(optimizer)
        # `args` are the step method's, the optimizer itself first.
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if closure is None:
            auto.open("optimizer")
            return None

        # A closure (Lightning's, LBFGS's) runs the forward and backward inside step(): they are
        # their own phases, and the optimizer's starts once the closure has returned.
        def closure_outside_the_optimizer_phase(*a, **k):
            auto.close("optimizer")
            try:
                return closure(*a, **k)
            finally:
                auto.open("optimizer")

        if "closure" in kwargs:
            return args, dict(kwargs, closure=closure_outside_the_optimizer_phase)
        return (args[0], closure_outside_the_optimizer_phase) + tuple(args[2:]), kwargs

    def optimizer_post(optimizer, args, kwargs):
        if not auto.mine():
            return
        auto.close("optimizer")
        auto.updated()

    # Whether the job makes an optimizer at all: one that makes none updates by hand, and its
    # steps end at each backward (pytorch/examples' word_language_model had 1 step for 60).
    optimizer_class = optim.Optimizer
    optimizer_init = optimizer_class.__init__

    def init_noting(self, *args, **kwargs):
        auto.optimizers_made = True
        return optimizer_init(self, *args, **kwargs)

    init_noting.__wrapped__ = optimizer_init
    optimizer_class.__init__ = init_noting
    undo.append(lambda: setattr(optimizer_class, "__init__", optimizer_init))

    undo.append(optim.register_optimizer_step_pre_hook(optimizer_pre).remove)
    undo.append(optim.register_optimizer_step_post_hook(optimizer_post).remove)

    autograd = torch.autograd
    backward = autograd.backward

    def backward_phase(*args, **kwargs):
        opened = False
        mine = auto.mine()
        if mine:
            auto.training_event()
            opened = auto.open("backward")
        try:
            return backward(*args, **kwargs)
        finally:
            if opened:
                auto.close("backward")
            if mine and not auto.optimizers_made:
                auto.updated()

    backward_phase.__wrapped__ = backward
    backward_phase.__doc__ = backward.__doc__
    autograd.backward = backward_phase
    undo.append(lambda: setattr(autograd, "backward", backward))

    try:
        from torch.utils.data import dataloader
    except ImportError:
        dataloader = None
    base = getattr(dataloader, "_BaseDataLoaderIter", None)
    if base is not None:
        next_batch = base.__next__

        def next_with_phase(self):
            if not auto.mine():
                return next_batch(self)
            start_after = auto.fetching(self)
            opened = auto.open("data")
            try:
                batch = next_batch(self)
            finally:
                if opened:
                    auto.close("data")
            if start_after:
                auto.start_step()
            return batch

        next_with_phase.__wrapped__ = next_batch
        base.__next__ = next_with_phase
        undo.append(lambda: setattr(base, "__next__", next_batch))
    return auto
