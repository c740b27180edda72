# Reads this thread's stack through the preloaded library (memsight_python_stack) in several
# shapes of Python code and prints, for each, the Python frames it read and the ones the
# interpreter itself reports (sys._getframe), as JSON lines the test compares.
import ctypes
import json
import sys
import threading

lib = ctypes.CDLL(None)
lib.memsight_python_frames.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
lib.memsight_python_frames.restype = ctypes.c_int
lib.memsight_python_stack.restype = ctypes.c_void_p
lib.memsight_string_free.argtypes = [ctypes.c_void_p]


def expected(frame):
    out = []
    while frame is not None:
        code = frame.f_code
        out.append([code.co_filename, frame.f_lineno, getattr(code, "co_qualname", code.co_name)])
        frame = frame.f_back
    return out


def probe(shape):
    # Both reads on one line: the same line number for this frame.
    p = lib.memsight_python_stack(); want = expected(sys._getframe())
    text = ctypes.string_at(p).decode("utf-8")
    lib.memsight_string_free(p)
    lines = text.splitlines()
    read = []
    gaps = []  # native frames between Python frames (a C-level call in between)
    native_run = 0
    for line in lines:
        if line.startswith("0x"):
            native_run += 1
            continue
        if read and native_run:
            gaps.append(len(read))
        native_run = 0
        where, _, function = line.partition(" ")
        file, _, lineno = where.rpartition(":")
        read.append([file, int(lineno), function])
    print(json.dumps({"shape": shape, "read": read, "want": want, "gaps": gaps}), flush=True)


class Model:
    def forward(self, depth):
        if depth:
            return self.forward(depth - 1)
        probe("nested methods")


def größe():
    probe("non-ASCII name")


def through_c():
    sorted([2, 1], key=lambda x: x if x == 2 else probe("through C") or x)


def generator():
    yield probe("generator")


def turn_on():
    why = ctypes.c_void_p()
    if not lib.memsight_python_frames(b"turn_on", ctypes.byref(why)):
        print(json.dumps({"off": ctypes.string_at(why.value).decode()}), flush=True)
        sys.exit(3)


def main():
    turn_on()
    Model().forward(3)
    größe()
    through_c()
    list(generator())
    t = threading.Thread(target=lambda: probe("another thread"))
    t.start()
    t.join()


main()
