"""Device memory by Python line (memsight/_device_lines.py) over snapshots in the format of
``torch.cuda.memory._snapshot()`` (tests/cuda_snapshot.py says how they are made without a GPU):
the replayed peak equals the allocator's own, each line and category holds the bytes built into
the snapshot, a history too short to reach the peak says so, an OOM names the line that asked,
torch's own reader of the format takes the snapshots, and under ``memsight run``'s preload the
lines reach the report (torch.cuda faked, as in test_torch.py).

Run: python -m unittest discover -s integrations/python/tests -v
"""

import copy
import sys
import unittest

import cuda_snapshot as cs
from harness import PACKAGE_ROOT, last_json, need, run

sys.path.insert(0, PACKAGE_ROOT)  # the package under test, not an installed one
from memsight import _device_lines as dl  # noqa: E402

MIB = cs.MIB


def by_line(lines):
    return {(l["file"], l["line"]): l["bytes"] for l in lines["lines"]}


def by_category(lines):
    return {c["name"]: c["bytes"] for c in lines["categories"]}


class Attribution(unittest.TestCase):
    def setUp(self):
        self.alloc, self.expected = cs.training()
        self.snapshot = self.alloc.snapshot()

    def peak(self, snapshot=None, **kw):
        return dl.device_lines(snapshot or self.snapshot, 0, "peak", allocator_peak_bytes=self.alloc.requested_peak,
                               library_paths=cs.LIBRARY_PATHS, **kw)

    def test_the_replayed_peak_is_the_allocators_and_each_line_holds_its_bytes(self):
        got = self.peak()
        self.assertEqual(got["live_bytes"], self.expected["peak_bytes"])
        self.assertEqual(got["live_bytes"], self.alloc.requested_peak)
        self.assertEqual(self.alloc.peak - got["live_bytes"], 512 - 100)  # the batch's rounding
        self.assertTrue(got["covers_peak"])
        self.assertEqual(by_line(got), self.expected["lines"])
        self.assertEqual(by_category(got), self.expected["categories"])
        # Largest first; the top line is the job's own (model.py), not torch's linear.py.
        self.assertEqual((got["lines"][0]["file"], got["lines"][0]["line"]), (cs.MODEL, 87))
        self.assertEqual(got["lines"][0]["category"], "activations")
        self.assertIn("linear.py:134 forward", got["lines"][0]["stack"][0])
        self.assertEqual(got["no_stack_bytes"], (16 + 4 * 32 + 40) * MIB)
        self.assertEqual(got["other_lines_bytes"], 0)

    def test_top_bounds_the_lines_and_the_rest_is_summed(self):
        got = self.peak(top=2)
        self.assertEqual(len(got["lines"]), 2)
        shown = sum(l["bytes"] for l in got["lines"])
        self.assertEqual(got["other_lines_bytes"], got["live_bytes"] - got["no_stack_bytes"] - shown)

    def test_a_history_that_lost_the_peak_says_so_and_gives_its_windows_highest(self):
        # The ring kept only the last step's optimizer actions: the peak (in backward) is gone.
        short = self.alloc.snapshot(max_entries=8)
        got = self.peak(short)
        self.assertFalse(got["covers_peak"])
        self.assertLess(got["live_bytes"], self.alloc.requested_peak)
        self.assertEqual(got["history_entries"], 8)

    def test_now_is_what_is_allocated_at_the_end(self):
        got = dl.device_lines(self.snapshot, 0, "now", library_paths=cs.LIBRARY_PATHS)
        # Parameters, gradients, Adam's state and the early block stay.
        self.assertEqual(got["live_bytes"], (16 + 4 * 32 + 4 * 32 + 2 * 64) * MIB)
        self.assertEqual(by_category(got)["backward"], 4 * 32 * MIB)
        self.assertEqual(by_category(got)["before history"], 16 * MIB)

    def test_an_oom_names_the_line_that_asked(self):
        self.alloc.oom(3 << 30, cs.OOM_AT, device_free=200 * MIB)
        got = dl.device_lines(self.alloc.snapshot(), 0, "oom", library_paths=cs.LIBRARY_PATHS)
        failed = got["failed_request"]
        self.assertEqual((failed["file"], failed["line"], failed["bytes"]), (cs.MODEL, 190, 3 << 30))
        self.assertEqual(failed["category"], "activations")

    def test_no_history_gives_the_live_blocks_with_their_frames(self):
        snap = copy.deepcopy(self.snapshot)
        snap["device_traces"] = []
        got = self.peak(snap)
        self.assertEqual(got["history_entries"], 0)
        self.assertEqual(by_line(got)[(cs.TRAIN, 210)], 4 * 32 * MIB)

    def test_bad_input_is_tolerated(self):
        for bad in ({}, {"segments": None, "device_traces": None}, {"segments": [1, {"blocks": [None]}]},
                    {"device_traces": [[{"action": "alloc", "addr": "x"}, 3]]}):
            got = dl.device_lines(bad, 0, "peak", library_paths=())
            self.assertEqual(got["live_bytes"], 0)
        with self.assertRaises(TypeError):
            dl.device_lines(None, 0, "peak")

    def test_another_device_is_apart(self):
        got = dl.device_lines(self.snapshot, 1, "peak", library_paths=cs.LIBRARY_PATHS)
        self.assertEqual(got["live_bytes"], 0)


class RustFixture(unittest.TestCase):
    def test_the_rust_tests_fixture_is_this_modules_output(self):
        """profiler/analysis/tests/fixtures/device_lines.json, which the Rust tests render, is what
        this module writes for the training fixture (regenerate it with the code below)."""
        import json
        import os

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "profiler", "analysis",
                            "tests", "fixtures", "device_lines.json")
        with open(path) as f:
            stored = json.load(f)
        a, _ = cs.training()
        peak = dl.device_lines(a.snapshot(), 0, "peak", allocator_peak_bytes=a.requested_peak,
                               library_paths=cs.LIBRARY_PATHS, top=4)
        a.oom(3 << 30, cs.OOM_AT, device_free=200 * MIB)
        oom = dl.device_lines(a.snapshot(), 0, "oom", library_paths=cs.LIBRARY_PATHS, top=4)
        self.assertEqual(stored["peak"], peak)
        self.assertEqual(stored["oom"], oom)


class TorchReadsTheFixture(unittest.TestCase):
    """The fixture is the format torch's own snapshot tools read (torch.cuda._memory_viz)."""

    def test_the_fixture_has_the_real_emitters_keys(self):
        """A torch built with CUDA runs ``_snapshot()`` without a GPU (an allocator with nothing in
        it): its dict has the fixture's keys and settings, and attributing it gives nothing."""
        need("torch")
        import torch

        if torch.version.cuda is None:
            self.skipTest("torch %s has no CUDA compiled in" % torch.__version__)
        try:
            real = torch.cuda.memory._snapshot()
        except Exception as e:  # noqa: BLE001 - an older torch that needs a device for it
            self.skipTest("torch.cuda.memory._snapshot() needs a device here: %s" % e)
        alloc, _ = cs.training()
        fixture = alloc.snapshot()
        self.assertEqual(sorted(real), sorted(fixture))
        self.assertEqual(real["allocator_settings"], fixture["allocator_settings"])
        got = dl.device_lines(real, 0, "peak", library_paths=())
        self.assertEqual((got["live_bytes"], got["lines"], got["history_entries"]), (0, [], 0))

    def test_the_history_call_passes_torchs_own_checks(self):
        """memsight.torch's call of _record_memory_history passes torch's argument checks (which
        run before CUDA starts: without a driver it fails only there)."""
        need("torch")
        import torch

        if torch.version.cuda is None or torch.cuda.is_available():
            self.skipTest("needs a torch built with CUDA on a machine without a GPU")
        with self.assertRaises(RuntimeError) as wrong:
            torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="nope", max_entries=10)
        self.assertIn("expected stacks", str(wrong.exception))
        try:
            torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                     max_entries=100_000)
        except Exception as e:  # noqa: BLE001 - CUDA's start, after the arguments were taken
            self.assertNotIn("expected", str(e))

    def test_memory_viz_reads_it(self):
        need("torch")
        from torch.cuda import _memory_viz

        alloc, _ = cs.training()
        alloc.oom(3 << 30, cs.OOM_AT, device_free=200 * MIB)
        snap = alloc.snapshot()
        self.assertIn("Summary of segments", _memory_viz.segsum(snap))
        self.assertIn("entries", _memory_viz.trace(snap))
        folded = _memory_viz.memory(snap, format_flamegraph=lambda lines: lines)
        self.assertIn("train.py:210:<module>", folded)
        self.assertIn("active_allocated", _memory_viz.segments(snap, format_flamegraph=lambda lines: lines))


class ReadSchedule(unittest.TestCase):
    """The lines at the peak are read again when the allocator's peak grew 5% and 0.5 s passed,
    at once when it doubled, and at the end when it grew at all."""

    def test_when_the_lines_are_read(self):
        need("torch")
        from unittest import mock

        import memsight
        import memsight.torch as mt

        poller = object.__new__(mt._Poller)
        poller.captured, poller.last_read, poller.library_paths = {}, None, cs.LIBRARY_PATHS
        alloc, _ = cs.training()
        snap = alloc.snapshot()
        reads, pushed, clock = [], [], [1000.0]
        stats = {"requested_bytes": {"all": {"peak": 0}}}
        with mock.patch("torch.cuda.memory._snapshot", lambda device=None: reads.append(1) or snap), \
                mock.patch("torch.cuda.memory_stats_as_nested_dict", lambda device: stats), \
                mock.patch.object(memsight, "_device_lines_push", pushed.append), \
                mock.patch("time.monotonic", lambda: clock[0]):

            def tick(peak, dt=0.0, final=False):
                clock[0] += dt
                stats["requested_bytes"]["all"]["peak"] = peak - 1  # the bytes asked for
                poller._read_lines([{"index": 0, "backend": "torch-cuda", "peak_allocated_bytes": peak}], final)
                return len(reads)

            self.assertEqual(tick(100), 1)  # the first peak
            self.assertEqual(tick(110, dt=0.1), 1)  # grew 10%, too soon
            self.assertEqual(tick(110, dt=0.5), 2)  # grew 10%, 0.6 s after the read
            self.assertEqual(tick(114, dt=1), 2)  # grew 3.6%
            self.assertEqual(tick(220), 3)  # doubled: at once
            self.assertEqual(tick(220, final=True), 3)  # no growth
            self.assertEqual(tick(221, final=True), 4)  # the end: any growth
        self.assertEqual([p["allocator_peak_bytes"] for p in pushed], [99, 109, 219, 220])


# torch.cuda faked: one initialised device whose allocator history is the fixture's.
FAKE = """
import json, sys, torch
from unittest import mock
sys.path.insert(0, %(tests)r)
import cuda_snapshot as cs
alloc, expected = cs.training()
alloc.oom(3 << 30, cs.OOM_AT, device_free=200 * cs.MIB)
snap = alloc.snapshot()
def stat(current, peak):
    return {"all": {"current": current, "peak": peak, "allocated": peak, "freed": 0}}
def stats(device):
    return {"allocated_bytes": stat(alloc.allocated, alloc.peak), "reserved_bytes": stat(alloc.peak, alloc.peak),
            "requested_bytes": stat(alloc.requested, alloc.requested_peak)}
history, observers = [], []
for p in [mock.patch("torch.cuda.is_available", lambda: True),
          mock.patch("torch.cuda.is_initialized", lambda: True),
          mock.patch("torch.cuda.device_count", lambda: 1),
          mock.patch("torch.cuda.memory_stats_as_nested_dict", stats),
          mock.patch("torch.cuda.get_device_name", lambda i: "Fake H100"),
          mock.patch("torch.cuda.mem_get_info", lambda i: (1 << 30, 80 << 30)),
          mock.patch("torch.cuda.memory_snapshot", lambda include_traces=True: snap["segments"]),
          mock.patch("torch.cuda.memory._record_memory_history", lambda *a, **k: history.append(k)),
          mock.patch("torch.cuda.memory._snapshot", lambda device=None: snap),
          mock.patch("torch._C._cuda_attach_out_of_memory_observer", observers.append, create=True)]:
    p.start()
"""


class UnderThePreload(unittest.TestCase):
    def setUp(self):
        need("torch")

    def test_the_lines_at_the_peak_and_at_an_oom_reach_the_report(self):
        import os

        report, out = run(
            FAKE % {"tests": os.path.dirname(os.path.abspath(__file__))}
            + """
import memsight, memsight.torch
memsight.torch._device_lines.default_library_paths = lambda: cs.LIBRARY_PATHS
status = memsight.torch.install(interval=0.05, device_history=True)
observers[0](0, 3 << 30, 80 << 30, 200 * cs.MIB)
print(json.dumps({"status": status, "history": history, "peak": alloc.requested_peak}))
"""
        )
        got = last_json(out)
        self.assertEqual(got["history"][0]["stacks"], "python")
        self.assertEqual(got["history"][0]["context"], "alloc")
        self.assertEqual(got["history"][0]["max_entries"], 100000)
        self.assertIn("torch-cuda history", got["status"])
        [peak] = report["device_lines"]
        self.assertEqual(peak["moment"], "peak")
        self.assertEqual(peak["live_bytes"], got["peak"])
        self.assertTrue(peak["covers_peak"])
        self.assertEqual((peak["lines"][0]["file"], peak["lines"][0]["line"]), (cs.MODEL, 87))
        [oom] = report["device_ooms"]
        self.assertEqual(oom["lines"]["moment"], "oom")
        self.assertEqual(oom["lines"]["failed_request"]["line"], 190)
        self.assertEqual(oom["lines"]["failed_request"]["bytes"], 3 << 30)

    def test_without_the_flag_the_history_stays_off(self):
        import os

        report, out = run(
            FAKE % {"tests": os.path.dirname(os.path.abspath(__file__))}
            + """
import memsight, memsight.torch
status = memsight.torch.install(interval=0.05)
observers[0](0, 3 << 30, 80 << 30, 200 * cs.MIB)
print(json.dumps({"status": status, "history": history}))
"""
        )
        got = last_json(out)
        self.assertEqual(got["history"], [])
        self.assertNotIn("torch-cuda history", got["status"])
        self.assertNotIn("device_lines", report)
        self.assertNotIn("lines", report["device_ooms"][0])


if __name__ == "__main__":
    unittest.main()
