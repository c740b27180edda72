"""Builds ``torch.cuda.memory._snapshot()`` dicts for the tests, without a GPU.

No snapshot recorded on a device was found in a public repository, so these are written from the
format's emitter, field for field: ``THCPModule_memorySnapshot`` in torch/csrc/cuda/Module.cpp
(what ``torch.cuda.memory._snapshot()`` returns in torch 2.x): segments with ``device``,
``address``, ``total_size``, ``allocated_size``, ``active_size``, ``requested_size``, ``stream``,
``segment_type``, ``segment_pool_id``, ``is_expandable``, ``frames`` and ``blocks`` (``address``,
``size``, ``requested_size``, ``state``, ``frames``); ``device_traces`` (``action``, ``addr`` —
``device_free`` for an ``oom`` —, ``size``, ``stream``, ``time_us``, ``frames`` when recorded);
``allocator_settings`` and ``external_annotations``. Frames are ``filename``/``line``/``name``,
innermost first; a backward allocation has none under ``stacks="python"`` (autograd's device
thread). As in c10/cuda/CUDACachingAllocator.cpp, a history action's ``size`` is the size asked
for (``orig_size``, the block's ``requested_size``), not the block's rounded ``size``. The
allocator below rounds to 512 bytes, makes one segment per allocation (large blocks) and frees in
place, as the caching allocator's large pool does for these sizes; a test checks that torch's own
reader of the format (``torch.cuda._memory_viz``) takes them.
"""

MIB = 1 << 20
TORCH = "/opt/venv/lib/python3.12/site-packages/torch"
STDLIB = "/opt/venv/lib/python3.12"
#: What a job's ``default_library_paths()`` would be for these paths.
LIBRARY_PATHS = (STDLIB,)
TRAIN = "/home/u/nanoGPT/train.py"
MODEL = "/home/u/nanoGPT/model.py"


def frame(filename, line, name):
    return {"filename": filename, "line": line, "name": name}


class Allocator:
    """A caching allocator's record of one device, as the snapshot shows it."""

    def __init__(self, device=0):
        self.device = device
        self.next_addr = 0x7F0000000000
        self.time_us = 1_700_000_000_000_000
        self.blocks = {}  # addr -> [size, requested, state, frames]
        self.segments = []  # [addr, total, frames]
        self.trace = []
        self.recording = False
        self.allocated = 0  # rounded block sizes: torch.cuda.memory_allocated
        self.peak = 0
        self.requested = 0  # sizes asked for: memory_stats()["requested_bytes.all.current"]
        self.requested_peak = 0

    def _event(self, action, size, frames, addr=None, device_free=None):
        self.time_us += 7
        if not self.recording:
            return
        e = {"action": action}
        if action == "oom":
            e["device_free"] = device_free
        else:
            e["addr"] = addr
        e.update(size=size, stream=0, time_us=self.time_us)
        if frames is not None:
            e["frames"] = frames
        self.trace.append(e)

    def alloc(self, requested, frames):
        size = -(-requested // 512) * 512
        addr = self.next_addr
        self.next_addr += max(size, 2 * MIB)
        self.segments.append([addr, size, frames if self.recording else []])
        self._event("segment_alloc", size, frames, addr)
        self.blocks[addr] = [size, requested, "active_allocated", frames if self.recording else []]
        self._event("alloc", requested, frames, addr)
        self.allocated += size
        self.peak = max(self.peak, self.allocated)
        self.requested += requested
        self.requested_peak = max(self.requested_peak, self.requested)
        return addr

    def free(self, addr, frames=None):
        b = self.blocks[addr]
        self._event("free_requested", b[1], frames, addr)
        self._event("free_completed", b[1], frames, addr)
        b[2] = "inactive"
        b[3] = []
        self.allocated -= b[0]
        self.requested -= b[1]

    def oom(self, requested, frames, device_free):
        self._event("oom", requested, frames, device_free=device_free)

    def snapshot(self, max_entries=None):
        segments = []
        for addr, total, frames in self.segments:
            size, requested, state, bframes = self.blocks[addr]
            allocated = size if state == "active_allocated" else 0
            segments.append({
                "device": self.device,
                "address": addr,
                "total_size": total,
                "allocated_size": allocated,
                "active_size": allocated,
                "requested_size": requested if allocated else 0,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": frames,
                "blocks": [{
                    "address": addr,
                    "size": size,
                    "requested_size": requested,
                    "state": state,
                    "frames": bframes,
                }],
            })
        trace = self.trace if max_entries is None else self.trace[-max_entries:]
        traces = [[] for _ in range(self.device)] + [list(trace)]
        return {
            "segments": segments,
            "device_traces": traces,
            # As torch 2.11's emitter writes them with the default settings (read from it by
            # test_device_lines on a torch built with CUDA: its _snapshot() runs without a GPU).
            "allocator_settings": {
                "PYTORCH_CUDA_ALLOC_CONF": "",
                "expandable_segments": False,
                "garbage_collection_threshold": 0.0,
                "graph_capture_record_stream_reuse": False,
                "max_split_size": -1,
                "pinned_num_register_threads": 1,
                "pinned_use_cuda_host_register": False,
                "release_lock_on_cudamalloc": False,
                "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)},
            },
            "external_annotations": [],
        }


# The stacks of a small GPT's training step, as torch's Python tracebacks show them.
def to_device(line):
    return [frame(TORCH + "/nn/modules/module.py", 1355, "convert"),
            frame(TORCH + "/nn/modules/module.py", 942, "_apply"),
            frame(TORCH + "/nn/modules/module.py", 1369, "to"),
            frame(TRAIN, line, "<module>")]


def forward(model_line, torch_file, torch_line, torch_fn):
    return [frame(TORCH + torch_file, torch_line, torch_fn),
            frame(TORCH + "/nn/modules/module.py", 1784, "_call_impl"),
            frame(TORCH + "/nn/modules/module.py", 1773, "_wrapped_call_impl"),
            frame(MODEL, model_line, "forward"),
            frame(TORCH + "/nn/modules/module.py", 1784, "_call_impl"),
            frame(TORCH + "/nn/modules/module.py", 1773, "_wrapped_call_impl"),
            frame(TRAIN, 300, "<module>")]


ADAM_INIT = [frame(TORCH + "/optim/adam.py", 168, "_init_group"),
             frame(TORCH + "/optim/adam.py", 247, "step"),
             frame(TORCH + "/optim/optimizer.py", 516, "wrapper"),
             frame(TRAIN, 310, "<module>")]
ADAM_TMP = [frame(TORCH + "/optim/adam.py", 640, "_multi_tensor_adam"),
            frame(TORCH + "/optim/adam.py", 262, "step"),
            frame(TRAIN, 310, "<module>")]
BATCH = [frame(TRAIN, 116, "get_batch"), frame(TRAIN, 298, "<module>")]
OOM_AT = [frame(TORCH + "/nn/functional.py", 3462, "cross_entropy"),
          frame(MODEL, 190, "forward"),
          frame(TORCH + "/nn/modules/module.py", 1784, "_call_impl"),
          frame(TRAIN, 300, "<module>")]


def training(steps=2):
    """A small GPT's training on one device: 16 MiB allocated before the history starts, 4 x 32 MiB
    of parameters (train.py:210), per step a batch (train.py:116) and activations (model.py:87 and
    model.py:120), gradients of the parameters in backward and a backward temporary (no frames),
    Adam's state on the first step (2 x 64 MiB, train.py:310) and temporaries inside each step.
    Returns ``(allocator, expected)``: the bytes asked for per line and per category at the peak,
    by construction (the second step's backward, once Adam's state exists)."""
    a = Allocator()
    a.alloc(16 * MIB, [])  # before the history: no frames, no trace entry
    a.recording = True
    params = [a.alloc(32 * MIB, to_device(210)) for _ in range(4)]
    grads = adam = None
    for _ in range(steps):
        batch = a.alloc(4 * MIB + 100, BATCH)  # rounded to 4 MiB + 512 in its block
        acts = [a.alloc(48 * MIB, forward(87, "/nn/modules/linear.py", 134, "forward")) for _ in range(3)]
        acts += [a.alloc(24 * MIB, forward(120, "/nn/functional.py", 2910, "gelu"))]
        if grads is None:
            grads = [a.alloc(32 * MIB, []) for _ in params]  # backward: autograd's thread
        tmp = a.alloc(40 * MIB, [])  # a backward temporary
        a.free(tmp)
        for x in acts:
            a.free(x)
        a.free(batch)
        if adam is None:
            adam = [a.alloc(64 * MIB, ADAM_INIT) for _ in range(2)]
        for t in [a.alloc(16 * MIB, ADAM_TMP) for _ in range(2)]:
            a.free(t)
    expected = {
        "peak_bytes": (16 + 4 * 32 + 4 + 3 * 48 + 24 + 4 * 32 + 40 + 2 * 64) * MIB + 100,
        "lines": {
            (MODEL, 87): 3 * 48 * MIB,
            (TRAIN, 210): 4 * 32 * MIB,
            (TRAIN, 310): 2 * 64 * MIB,
            (MODEL, 120): 24 * MIB,
            (TRAIN, 116): 4 * MIB + 100,
        },
        "categories": {
            "backward": (4 * 32 + 40) * MIB,
            "activations": (3 * 48 + 24) * MIB,
            "parameters": 4 * 32 * MIB,
            "optimizer state": 2 * 64 * MIB,
            "before history": 16 * MIB,
            "other": 4 * MIB + 100,
        },
    }
    return a, expected
