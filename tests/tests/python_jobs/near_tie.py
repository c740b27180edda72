"""Two moments that hold nearly the same heap, like a forward's end and its backward's start: the
first holds 24 MiB from `forward_end`, the second the same 24 MiB from `backward_start` plus 20 KB
more. The heap's peak is the second moment, and so are its sites."""


def forward_end():
    return bytearray(24 << 20)  # FORWARD_END


def backward_start():
    return bytearray(24 << 20)  # BACKWARD_START


held = forward_end()
held[0] = 1
del held
held = backward_start()
more = [bytearray(1000) for _ in range(20)]
held[0] = len(more)
del held, more
