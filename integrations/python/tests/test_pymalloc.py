"""Python's small-object arenas (memsight/_pymalloc.py): CPython's own text is parsed in both of its
shapes, a job holding a known number of small objects gets them in the report's
``python_arenas`` (and not in the heap count, which is the blind spot this fills), and a build
without pymalloc reports none.

Run: python -m unittest discover -s integrations/python/tests -v
"""

import json
import os
import subprocess
import sys
import unittest

from harness import PACKAGE_ROOT, last_json, run

sys.path.insert(0, PACKAGE_ROOT)  # the package under test, not an installed one
from memsight import _pymalloc  # noqa: E402

# CPython 3.11's text (sys._debugmallocstats), trimmed to the rows read.
TEXT_311 = b"""Small block threshold = 512, in 32 size classes.

# arenas allocated total           =                    8
# arenas reclaimed                 =                    0
# arenas highwater mark            =                   12
# arenas allocated current         =                    8
8 arenas * 1048576 bytes/arena     =            8,388,608

# bytes in allocated blocks        =            7,231,056
# bytes in available blocks        =              337,664
# bytes lost to pool headers       =               22,272
# bytes lost to quantization       =               11,184
# bytes lost to arena alignment    =               98,304
Total                              =            8,388,608
"""

# CPython 3.9: 256 KiB arenas, and no "N arenas * S" row when it is left out.
TEXT_39 = b"""# arenas allocated total           =                   30
# arenas reclaimed                 =                    2
# arenas highwater mark            =                   28
# arenas allocated current         =                   28

# bytes in allocated blocks        =            6,000,000
# bytes in available blocks        =              800,000
# bytes lost to pool headers       =               40,000
# bytes lost to quantization       =               30,000
# bytes lost to arena alignment    =                    0
Total                              =            7,340,032
"""

N = 1_000_000  # object() is 16 bytes: pymalloc's 16-byte class, 16 MB in blocks


class Parse(unittest.TestCase):
    def test_311(self):
        got = _pymalloc.parse(TEXT_311)
        self.assertEqual(got, {"arenas": 8, "peak_arenas": 12, "allocated_blocks_bytes": 7_231_056,
                               "arena_size_bytes": 1 << 20, "bytes": 8 << 20, "peak_bytes": 12 << 20})

    def test_39_size_from_the_total(self):
        got = _pymalloc.parse(TEXT_39)
        self.assertEqual(got["arena_size_bytes"], 256 << 10)
        self.assertEqual(got["peak_bytes"], 28 * (256 << 10))

    def test_no_arenas_is_none(self):
        self.assertIsNone(_pymalloc.parse(b""))
        self.assertIsNone(_pymalloc.parse(b"garbage\n# arenas allocated current = x\n"))

    def test_this_interpreter(self):
        got = _pymalloc.stats()
        if got is None:
            self.skipTest("this interpreter runs without pymalloc")
        self.assertGreaterEqual(got["peak_arenas"], got["arenas"])
        self.assertEqual(got["bytes"], got["arenas"] * got["arena_size_bytes"])


class InTheReport(unittest.TestCase):
    def test_a_million_small_objects_are_in_python_arenas_not_in_the_heap(self):
        report, out = run(
            """
            import json, memsight, memsight._startup as startup
            from memsight import _pymalloc
            before, heap0 = _pymalloc.stats(), memsight.snapshot()["heap"]["live_bytes"]
            held = [None] * %d  # exactly 8 bytes per object, from malloc
            for i in range(len(held)):
                held[i] = object()
            after, heap1 = _pymalloc.stats(), memsight.snapshot()["heap"]["live_bytes"]
            startup._training_ends()  # what memsight run's start-up does as the interpreter exits
            print(json.dumps({"before": before, "after": after, "heap": heap1 - heap0}))
            """ % N
        )
        got = last_json(out)
        blocks = got["after"]["allocated_blocks_bytes"] - got["before"]["allocated_blocks_bytes"]
        self.assertAlmostEqual(blocks / (16 * N), 1.0, delta=0.01)
        # The heap count sees the list's pointer array (8 bytes each), not the objects' 16 (its
        # session's sampler thread allocates meanwhile too: a few KiB either way).
        self.assertAlmostEqual(got["heap"] / (8 * N), 1.0, delta=0.05)
        arenas = report["python_arenas"]
        self.assertGreaterEqual(arenas["peak_bytes"], 16 * N)
        self.assertEqual(arenas["peak_bytes"], arenas["peak_arenas"] * arenas["arena_size_bytes"])
        self.assertAlmostEqual(arenas["allocated_blocks_bytes"] / got["after"]["allocated_blocks_bytes"], 1.0,
                               delta=0.01)

    def test_without_pymalloc_there_is_none(self):
        env = dict(os.environ, PYTHONMALLOC="malloc", PYTHONPATH=PACKAGE_ROOT)
        p = subprocess.run([sys.executable, "-c", "from memsight import _pymalloc; print(_pymalloc.stats())"],
                           env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.stdout.strip(), "None", p.stderr)


if __name__ == "__main__":
    unittest.main()
