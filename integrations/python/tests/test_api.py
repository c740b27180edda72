"""The memsight package's own calls: steps, phases and snapshots reach the report under the
preloaded library; everything is a no-op without it and in a forked child; device samples and
OOM records in the report's shapes are accepted.

Run: python -m unittest discover -s integrations/python/tests -v
"""

import unittest

from harness import last_json, phases, run, source, steps


class WithoutSession(unittest.TestCase):
    def test_every_call_is_a_no_op(self):
        report, out = run(
            """
            import json, memsight
            memsight.step(3)
            with memsight.phase("train"):
                pass
            memsight._device_push("nvml", [{"index": 0, "backend": "nvml"}])
            memsight._device_absent("nvml", "why")
            memsight._device_oom({"t_ms": 0})
            print(json.dumps({"active": memsight.active(), "snapshot": memsight.snapshot()}))
            """,
            preload=False,
        )
        self.assertIsNone(report)
        self.assertEqual(last_json(out), {"active": False, "snapshot": None})


class WithSession(unittest.TestCase):
    def test_steps_phases_and_snapshot(self):
        report, out = run(
            """
            import json, memsight

            @memsight.phase("optimizer")
            def update():
                return bytearray(1 << 16)

            for n in range(4):
                memsight.step(n)
                with memsight.phase("train"):
                    with memsight.phase("forward"):
                        keep = [bytearray(1 << 20)]
                    update()
            snap = memsight.snapshot()
            print(json.dumps({"active": memsight.active(), "live": snap["heap"]["live_bytes"]}))
            """
        )
        got = last_json(out)
        self.assertTrue(got["active"])
        self.assertGreater(got["live"], 0)
        self.assertEqual(steps(report), [0, 1, 2, 3])
        self.assertEqual(
            phases(report), {"train": 4, "train/forward": 4, "train/optimizer": 4}
        )

    def test_forked_child_is_measured_on_its_own(self):
        report, out = run(
            """
            import json, os, memsight
            memsight.step(0)
            memsight.step(1)
            r, w = os.pipe()
            with memsight.phase("train"):
                pid = os.fork()  # the child leaves the parent's open phase too
                if pid == 0:
                    memsight.step(100)
                    with memsight.phase("child"):
                        pass
            if pid == 0:
                os.write(w, json.dumps({"active": memsight.active(),
                                        "snapshot": memsight.snapshot()}).encode())
                os._exit(0)
            os.close(w)
            child = json.loads(os.read(r, 4096))
            os.waitpid(pid, 0)
            memsight.step(2)
            print(json.dumps(child))
            """
        )
        child = last_json(out)
        # The child is measured on its own (its own step), and marks nothing in its parent.
        self.assertTrue(child["active"])
        self.assertEqual(child["snapshot"]["step"], 100)
        self.assertEqual(steps(report), [0, 1, 2])
        self.assertEqual(phases(report), {"train": 1})

    def test_device_sample_oom_and_absent_shapes(self):
        report, _ = run(
            """
            import time, memsight
            memsight.step(0)
            memsight._device_push("nvml", [{
                "index": 0, "backend": "nvml", "name": "Test GPU", "total_bytes": 1000,
                "free_bytes": 400, "used_bytes": 600, "utilization_pct": 7,
                "processes": [{"host_pid": 1, "pid": 1, "used_bytes": 500, "is_job": True},
                              {"host_pid": 2, "used_bytes": 100, "is_job": False}]}])
            memsight._device_absent("torch-cuda", "no CUDA here")
            memsight._device_oom({"t_ms": 0, "step": 0, "device": 0, "requested_bytes": 10,
                                  "total_bytes": 1000, "free_bytes": 5})
            time.sleep(0.35)
            """
        )
        dev = report["devices"][0]
        self.assertEqual((dev["backend"], dev["name"], dev["peak_used_bytes"]), ("nvml", "Test GPU", 600))
        self.assertEqual((dev["peak_others_bytes"], dev["peak_job_used_bytes"]), (100, 500))
        self.assertEqual(report["device_ooms"][0]["requested_bytes"], 10)
        self.assertEqual(source(report, "torch-cuda")["detail"], "no CUDA here")
        self.assertFalse(source(report, "torch-cuda")["available"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
