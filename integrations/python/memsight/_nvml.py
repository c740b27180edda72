"""NVML through ctypes (no pynvml needed): per device name, total/free/used memory and utilization,
and the GPU memory of every compute process, as memsight device samples of backend ``nvml``.

NVML numbers every GPU of the machine; the job's CUDA ordinals follow ``CUDA_VISIBLE_DEVICES``.
Samples carry the job's CUDA ordinal (so they line up with ``torch-cuda``) and only devices the
job can see are reported. NVML's PIDs are host PIDs; they are mapped to this PID namespace through
``NSpid`` in /proc/<pid>/status, as memsight's Rust NVML source does.
"""

import ctypes
import os

#: The driver's NVML library (the tests point it at a fake).
LIBRARY = "libnvidia-ml.so.1"

_SUCCESS = 0
_ERROR_INSUFFICIENT_SIZE = 7
#: NVML_VALUE_NOT_AVAILABLE for unsigned long long fields.
_NOT_AVAILABLE = ctypes.c_ulonglong(-1).value


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _ProcessInfoV1(ctypes.Structure):
    """nvmlProcessInfo_v1_t, for nvmlDeviceGetComputeRunningProcesses (no suffix)."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _ProcessInfoV2(ctypes.Structure):
    """nvmlProcessInfo_t (v2), for nvmlDeviceGetComputeRunningProcesses_v2 and _v3."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class NvmlError(Exception):
    """NVML could not be loaded or answered with an error (the message says which)."""


class Nvml:
    """The loaded and initialised NVML library, with the devices this job can see."""

    def __init__(self, libname=None):
        libname = libname or LIBRARY
        try:
            self._lib = ctypes.CDLL(libname)
        except OSError as e:
            raise NvmlError("%s could not be loaded (no NVIDIA driver here): %s" % (libname, e))
        lib = self._lib
        lib.nvmlErrorString.restype = ctypes.c_char_p
        self._check(self._fn("nvmlInit_v2", "nvmlInit")(), "nvmlInit")
        count = ctypes.c_uint(0)
        self._check(self._fn("nvmlDeviceGetCount_v2", "nvmlDeviceGetCount")(ctypes.byref(count)), "DeviceGetCount")
        self._by_index = self._fn("nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex")
        self._procs, self._proc_struct = self._process_call()
        self.devices = self._visible(count.value)
        self._pid_map = {}
        self._unseen = set()

    def _fn(self, *names):
        """The first of ``names`` this library exports."""
        for name in names:
            f = getattr(self._lib, name, None)
            if f is not None:
                return f
        raise NvmlError("NVML has none of %s" % ", ".join(names))

    def _check(self, rc, what):
        if rc != _SUCCESS:
            raise NvmlError("NVML %s failed: %s" % (what, self._lib.nvmlErrorString(rc).decode()))

    def _process_call(self):
        """The newest compute-process call this driver exports, with its struct."""
        for name, struct in (
            ("nvmlDeviceGetComputeRunningProcesses_v3", _ProcessInfoV2),
            ("nvmlDeviceGetComputeRunningProcesses_v2", _ProcessInfoV2),
            ("nvmlDeviceGetComputeRunningProcesses", _ProcessInfoV1),
        ):
            f = getattr(self._lib, name, None)
            if f is not None:
                return f, struct
        return None, None

    def _handle(self, nvml_index):
        h = ctypes.c_void_p()
        self._check(self._by_index(ctypes.c_uint(nvml_index), ctypes.byref(h)), "DeviceGetHandleByIndex")
        return h

    def _uuid(self, handle):
        buf = ctypes.create_string_buffer(96)
        if self._lib.nvmlDeviceGetUUID(handle, buf, ctypes.c_uint(len(buf))) != _SUCCESS:
            return None
        return buf.value.decode(errors="replace")

    def _visible(self, count):
        """[(cuda ordinal, nvml handle)] for the devices this job sees, per CUDA_VISIBLE_DEVICES.

        Entries that are integers or GPU UUIDs (or their unique prefixes) are mapped; anything
        else (MIG instances) falls back to NVML's own numbering.
        """
        handles = [self._handle(i) for i in range(count)]
        spec = os.environ.get("CUDA_VISIBLE_DEVICES")
        if spec is None:
            return list(enumerate(handles))
        uuids = [self._uuid(h) or "" for h in handles]
        out = []
        for entry in (e.strip() for e in spec.split(",")):
            if entry.isdigit() and int(entry) < count:
                out.append((len(out), handles[int(entry)]))
            elif entry.startswith("GPU-"):
                hits = [i for i, u in enumerate(uuids) if u.startswith(entry)]
                if len(hits) != 1:
                    break
                out.append((len(out), handles[hits[0]]))
            elif entry.startswith("MIG-"):
                return list(enumerate(handles))
            else:
                break  # CUDA stops at the first invalid entry
        return out

    def samples(self):
        """This moment's samples, one per visible device (a list of dicts)."""
        out = []
        for index, h in self.devices:
            s = {"index": index, "backend": "nvml"}
            name = ctypes.create_string_buffer(96)
            if self._lib.nvmlDeviceGetName(h, name, ctypes.c_uint(len(name))) == _SUCCESS:
                s["name"] = name.value.decode(errors="replace")
            mem = _Memory()
            if self._lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(mem)) == _SUCCESS:
                s.update(total_bytes=mem.total, free_bytes=mem.free, used_bytes=mem.used)
            util = _Utilization()
            if self._lib.nvmlDeviceGetUtilizationRates(h, ctypes.byref(util)) == _SUCCESS:
                s["utilization_pct"] = util.gpu
            s["processes"] = self._processes(h)
            out.append(s)
        return out

    def processes(self, cuda_index):
        """The compute processes on the job's device ``cuda_index`` (for an OOM record)."""
        for index, h in self.devices:
            if index == cuda_index:
                return self._processes(h)
        return []

    def _processes(self, handle):
        if self._procs is None:
            return []
        n = ctypes.c_uint(0)
        infos = None
        for _ in range(3):  # the list may grow between the calls
            infos = (self._proc_struct * max(n.value, 1))()
            rc = self._procs(handle, ctypes.byref(n), infos)
            if rc == _SUCCESS:
                break
            if rc != _ERROR_INSUFFICIENT_SIZE:
                return []
        else:
            return []
        me = os.getpid()
        out = []
        for p in infos[: n.value]:
            local = self._local_pid(p.pid)
            proc = {"host_pid": p.pid, "is_job": local == me}
            if local is not None:
                proc["pid"] = local
            if p.usedGpuMemory != _NOT_AVAILABLE:
                proc["used_bytes"] = p.usedGpuMemory
            out.append(proc)
        return out

    def _local_pid(self, host_pid):
        """``host_pid`` in this PID namespace, or None when that process is not visible here."""
        if host_pid not in self._pid_map and host_pid not in self._unseen:
            self._pid_map = host_pid_map()
            if host_pid not in self._pid_map:
                self._unseen.add(host_pid)  # another container's: scan again only for new PIDs
        return self._pid_map.get(host_pid)


def host_pid_map():
    """Host PID -> PID here, from the first ``NSpid`` field of every visible process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/status" % entry) as f:
                for line in f:
                    if line.startswith("NSpid:"):
                        out[int(line.split()[1])] = int(entry)
                        break
        except (OSError, ValueError, IndexError):
            continue  # the process ended, or an old kernel without NSpid
    return out
