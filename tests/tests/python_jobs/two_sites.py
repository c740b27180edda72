"""Holds 200 MiB of CPU tensors made at one line of one function and 64 MiB of bytearrays made at
another, then writes what it holds by torch's and Python's own counts (argv[1]) — the truth the
report's allocation sites are checked against — and the two lines; what `import torch` left on
the heap, by glibc's count (heap_truth); and what importing `import_weight` holds, by `len`."""

import json
import sys
import time

import heap_truth

before_import = heap_truth.in_use()
import torch  # noqa: E402  (the import is what is measured)

torch_import_bytes = heap_truth.in_use() - before_import
import import_weight  # noqa: E402


def hold_tensors():
    return [torch.ones(5 << 20, dtype=torch.float32) for _ in range(10)]  # TENSOR LINE


def hold_bytes():
    return [bytearray(4 << 20) for _ in range(16)]  # BYTES LINE


def line_of(marker):
    with open(__file__) as f:
        return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(marker))


tensors = hold_tensors()
buffers = hold_bytes()
time.sleep(0.3)
with open(sys.argv[1], "w") as out:
    json.dump({
        "tensor_bytes": sum(t.untyped_storage().nbytes() for t in tensors),
        "bytearray_bytes": sum(len(b) for b in buffers),
        "tensor_line": line_of("# TENSOR LINE"),
        "bytes_line": line_of("# BYTES LINE"),
        "torch_import_bytes": torch_import_bytes,
        "import_weight_bytes": sum(len(b) for b in import_weight.HELD),
    }, out)
del tensors, buffers
