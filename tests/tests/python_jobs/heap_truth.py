"""The heap's in-use bytes by glibc's own count, for the jobs' truths: mallinfo2's in-use bytes of
every arena plus mmapped blocks, and the blocks memsight's heap sampler serves itself (one sample
per 512 KiB allocated), which are not glibc's: the kernel's count of the mappings in the sampler's
address range (64-65 TiB), a page at most over each block's own size."""

import ctypes


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2

SAMPLED_RANGE = (64 << 40, 65 << 40)


def sampled_mapped():
    total = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if SAMPLED_RANGE[0] <= start < SAMPLED_RANGE[1]:
                total += end - start
    return total


def in_use():
    m = libc.mallinfo2()
    return m.uordblks + m.hblkhd + sampled_mapped()
