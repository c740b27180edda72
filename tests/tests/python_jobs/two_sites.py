"""Holds 200 MiB of CPU tensors made at one line of one function and 64 MiB of bytearrays made at
another, then writes what it holds by torch's and Python's own counts (argv[1]) — the truth the
report's allocation sites are checked against — and the two lines."""

import json
import sys
import time

import torch


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
    }, out)
del tensors, buffers
