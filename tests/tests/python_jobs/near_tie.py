"""Two moments that hold nearly the same heap, like a forward's end and its backward's start: the
first holds 24 MiB from `forward_end`, the second the same 24 MiB from `backward_start` plus 20 KB
more. The heap's peak is the second moment, and so are its sites. The moments come after the
process's start-up has settled: within its first ~200 ms, on a busy machine, the first moment held
~0.2 MB more in some runs (start-up work elsewhere in the process), more than the 20 KB the test
turns on."""

import time


def forward_end():
    return bytearray(24 << 20)  # FORWARD_END


def backward_start():
    return bytearray(24 << 20)  # BACKWARD_START


time.sleep(0.5)
held = forward_end()
held[0] = 1
del held
held = backward_start()
more = [bytearray(1000) for _ in range(20)]
held[0] = len(more)
del held, more
