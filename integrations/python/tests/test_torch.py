"""memsight.torch: on this machine's torch (CPU-only or no GPU) it says why CUDA is absent and goes
on; with torch.cuda faked, the samples and OOM records it builds are accepted by the session with
the values PyTorch gave; on a real GPU (skipped elsewhere) a tensor and an OOM reach the report.

Run: python -m unittest discover -s integrations/python/tests -v
"""

import os
import shutil
import subprocess
import tempfile
import unittest

from harness import HERE, last_json, need, run, source

# torch.cuda as a job with one initialised 80 GiB device would see it (memory_stats nested form).
FAKE_CUDA = """
import torch
from unittest import mock

GIB = 1 << 30
def stat(current, peak):
    return {"all": {"current": current, "peak": peak, "allocated": peak, "freed": 0}}
def stats(device):
    return {"allocated_bytes": stat(3 * GIB, 5 * GIB), "reserved_bytes": stat(6 * GIB, 7 * GIB),
            "active_bytes": stat(3 * GIB, 5 * GIB), "inactive_split_bytes": stat(GIB, GIB),
            "requested_bytes": stat(3 * GIB - 10, 5 * GIB), "num_alloc_retries": 2, "num_ooms": 1}
segments = [{"device": 0, "total_size": 6 * GIB, "allocated_size": 3 * GIB, "blocks": [
    {"size": 3 * GIB, "state": "active_allocated"}, {"size": 2 * GIB, "state": "inactive"},
    {"size": GIB, "state": "inactive"}]}]
observers = []
for p in [mock.patch("torch.cuda.is_available", lambda: True),
          mock.patch("torch.cuda.is_initialized", lambda: True),
          mock.patch("torch.cuda.device_count", lambda: 1),
          mock.patch("torch.cuda.memory_stats_as_nested_dict", stats),
          mock.patch("torch.cuda.get_device_name", lambda i: "Fake H100"),
          mock.patch("torch.cuda.mem_get_info", lambda i: (70 * GIB, 80 * GIB)),
          mock.patch("torch.cuda.memory_snapshot", lambda include_traces=True: segments),
          mock.patch("torch._C._cuda_attach_out_of_memory_observer", observers.append, create=True)]:
    p.start()
"""


class OnThisMachine(unittest.TestCase):
    def setUp(self):
        need("torch")

    def test_install_says_why_cuda_is_absent_and_returns(self):
        report, out = run(
            """
            import json, threading, memsight, memsight.torch, torch
            first = memsight.torch.install(interval=0.05)
            again = memsight.torch.install()
            threads = [t.name for t in threading.enumerate() if t.name == "memsight-torch"]
            print(json.dumps({"first": first, "again": again, "threads": threads,
                              "cuda": torch.cuda.is_available()}))
            """
        )
        got = last_json(out)
        if got["cuda"]:
            self.skipTest("this machine has CUDA: see OnGpu")
        self.assertEqual(got["first"], got["again"])
        cuda = source(report, "torch-cuda")
        self.assertFalse(cuda["available"])
        self.assertTrue(cuda["detail"].startswith("torch.cuda.is_available() is False: torch "), cuda)
        self.assertIn(cuda["detail"], got["first"]["torch-cuda"])
        nvml = source(report, "nvml")
        if not nvml["available"]:
            self.assertIn("libnvidia-ml", nvml["detail"])
            self.assertEqual(got["threads"], [])  # nothing to poll

    def test_without_session_install_does_nothing(self):
        _, out = run(
            """
            import json, threading, memsight.torch
            print(json.dumps({"status": memsight.torch.install(),
                              "threads": [t.name for t in threading.enumerate()]}))
            """,
            preload=False,
        )
        self.assertEqual(last_json(out), {"status": {}, "threads": ["MainThread"]})

    def test_fake_cuda_samples_and_oom_reach_the_report(self):
        report, out = run(
            FAKE_CUDA
            + """
import json, time, warnings, memsight, memsight.torch
status = memsight.torch.install(interval=0.05)
memsight.step(7)
with memsight.phase("train"):
    time.sleep(0.3)
    observers[0](0, 4 * GIB, 80 * GIB, 100)           # what the allocator calls before raising
with mock.patch("torch.cuda.memory_stats_as_nested_dict", side_effect=RuntimeError("boom")), \\
        warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    observers[0](0, 1, 2, 3)                            # must not raise into the allocator
print(json.dumps({"status": status, "observers": len(observers),
                  "warned": [str(w.message) for w in caught]}))
"""
        )
        got = last_json(out)
        self.assertEqual(got["observers"], 1)
        self.assertEqual(len(got["warned"]), 1)
        self.assertIn("recording a CUDA OOM failed (RuntimeError: boom)", got["warned"][0])
        self.assertTrue(source(report, "torch-cuda")["available"])
        gib = 1 << 30
        dev = next(d for d in report["devices"] if d["backend"] == "torch-cuda")
        self.assertEqual(dev["name"], "Fake H100")
        self.assertEqual(dev["total_bytes"], 80 * gib)
        self.assertEqual((dev["peak_allocated_bytes"], dev["peak_reserved_bytes"]), (5 * gib, 7 * gib))
        self.assertEqual((dev["alloc_retries"], dev["ooms"]), (2, 1))
        (oom,) = report["device_ooms"]
        self.assertEqual((oom["step"], oom.get("phase")), (7, "train"))
        self.assertEqual(
            {k: oom.get(k) for k in ("device", "requested_bytes", "total_bytes", "free_bytes",
                                     "allocated_bytes", "reserved_bytes", "inactive_split_bytes",
                                     "largest_free_block_bytes")},
            {"device": 0, "requested_bytes": 4 * gib, "total_bytes": 80 * gib, "free_bytes": 100,
             "allocated_bytes": 3 * gib, "reserved_bytes": 6 * gib, "inactive_split_bytes": gib,
             "largest_free_block_bytes": 2 * gib},
        )


class FakeNvml(unittest.TestCase):
    """The ctypes NVML reader against tests/fake_nvml.c (two GPUs; the job holds 5 GiB on GPU 1)."""

    def setUp(self):
        need("torch")
        cc = shutil.which("cc")
        if cc is None:
            self.skipTest("no C compiler to build the fake NVML library")
        self.tmp = tempfile.TemporaryDirectory()
        self.lib = os.path.join(self.tmp.name, "libfake-nvml.so")
        subprocess.run([cc, "-shared", "-fPIC", "-o", self.lib, os.path.join(HERE, "fake_nvml.c")], check=True)

    def tearDown(self):
        self.tmp.cleanup()

    def run_with(self, visible):
        return run(
            """
            import json, os, time
            with open("/proc/self/status") as f:
                os.environ["FAKE_NVML_PID"] = [l.split()[1] for l in f if l.startswith("NSpid:")][0]
            visible = %r
            if visible is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = visible
            import memsight, memsight._nvml, memsight.torch
            memsight._nvml.LIBRARY = %r
            status = memsight.torch.install(interval=0.05)
            time.sleep(0.35)
            print(json.dumps({"status": status, "samples": memsight._nvml.Nvml().samples(),
                              "pid": os.getpid()}))
            """
            % (visible, self.lib)
        )

    def test_job_and_other_processes_on_the_visible_device(self):
        gib = 1 << 30
        for visible in ("1", "GPU-1111"):
            report, out = self.run_with(visible)
            got = last_json(out)
            self.assertEqual(got["status"]["nvml"], "1 device(s) through libnvidia-ml (ctypes)")
            (sample,) = got["samples"]
            self.assertEqual(
                {k: sample[k] for k in ("index", "name", "total_bytes", "used_bytes", "utilization_pct")},
                {"index": 0, "name": "Fake GPU one", "total_bytes": 80 * gib, "used_bytes": 7 * gib,
                 "utilization_pct": 42},
            )
            job, other = sample["processes"]
            self.assertEqual((job["is_job"], job["pid"], job["used_bytes"]), (True, got["pid"], 5 * gib))
            self.assertEqual(other, {"host_pid": 4000000000, "is_job": False, "used_bytes": 2 * gib})
            (dev,) = [d for d in report["devices"] if d["backend"] == "nvml"]
            self.assertEqual((dev["index"], dev["peak_used_bytes"]), (0, 7 * gib))
            self.assertEqual((dev["peak_job_used_bytes"], dev["peak_others_bytes"]), (5 * gib, 2 * gib))

    def test_device_order_follows_cuda_visible_devices(self):
        for visible, names in ((None, ["Fake GPU zero", "Fake GPU one"]),
                               ("1,0", ["Fake GPU one", "Fake GPU zero"]),
                               ("0,7,1", ["Fake GPU zero"])):  # CUDA stops at an invalid entry
            _, out = self.run_with(visible)
            got = last_json(out)["samples"]
            self.assertEqual([s["name"] for s in got], names, visible)
            self.assertEqual([s["index"] for s in got], list(range(len(names))))


class OnGpu(unittest.TestCase):
    """Runs only where torch sees a CUDA device."""

    def setUp(self):
        need("torch")
        import torch

        if not torch.cuda.is_available():
            reason = "no CUDA device here (torch.cuda.is_available() is False)"
            print("skip: " + reason)
            self.skipTest(reason)

    def test_tensor_and_oom_reach_the_report(self):
        report, out = run(
            """
            import json, time, torch, memsight, memsight.torch
            memsight.torch.install(interval=0.05)
            memsight.step(0)
            x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
            time.sleep(0.4)
            free, total = torch.cuda.mem_get_info(0)
            try:
                torch.empty(2 * total, dtype=torch.uint8, device="cuda")
                oom = False
            except torch.OutOfMemoryError:
                oom = True
            time.sleep(0.3)
            print(json.dumps({"oom": oom, "total": total}))
            """
        )
        got = last_json(out)
        self.assertTrue(got["oom"])
        dev = next(d for d in report["devices"] if d["backend"] == "torch-cuda" and d["index"] == 0)
        self.assertGreaterEqual(dev["peak_allocated_bytes"], 256 << 20)
        self.assertEqual(dev["total_bytes"], got["total"])
        (oom,) = report["device_ooms"]
        self.assertGreaterEqual(oom["requested_bytes"], 2 * got["total"])
        self.assertEqual(oom["device"], 0)
        nvml = source(report, "nvml")
        if nvml["available"]:
            nv = next(d for d in report["devices"] if d["backend"] == "nvml" and d["index"] == 0)
            self.assertIsNotNone(nv.get("peak_job_used_bytes"), nv)


if __name__ == "__main__":
    unittest.main(verbosity=2)
