"""Runs a Python snippet in a fresh interpreter, with or without memsight's preloaded library, and
hands back its report and what it printed. Every test here goes through it: the library starts its
session as it loads, so each case needs a process of its own.

The library is ``$MEMSIGHT_PRELOAD``, else the repository's ``target/preload/release`` build; the
interpreter is the one running the tests (the torch virtual environment of scripts/setup.sh).
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(PACKAGE_ROOT))
PRELOAD = os.environ.get("MEMSIGHT_PRELOAD") or os.path.join(
    REPO, "target", "preload", "release", "libmemsight_preload.so"
)


def need(*modules):
    """Skips the test (saying why) unless every module imports here."""
    for m in modules:
        if importlib.util.find_spec(m) is None:
            reason = "%s is not installed in %s (scripts/setup.sh installs it)" % (m, sys.executable)
            print("skip: " + reason, file=sys.stderr)
            raise unittest.SkipTest(reason)


def need_preload():
    if not os.path.exists(PRELOAD):
        reason = "no preload library at %s (build it: make build)" % PRELOAD
        print("skip: " + reason, file=sys.stderr)
        raise unittest.SkipTest(reason)


def run(code, preload=True, timeout=120):
    """Runs ``code`` (dedented); returns (report dict or None, stdout). Fails on a non-zero exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSIGHT_") and k != "LD_PRELOAD"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    env["PYTHONWARNINGS"] = "ignore::UserWarning"  # torch's NumPy notice and the like
    env["TOKENIZERS_PARALLELISM"] = "false"
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        if preload:
            need_preload()
            env.update(LD_PRELOAD=PRELOAD, MEMSIGHT_REPORT=report, MEMSIGHT_RING="off", MEMSIGHT_QUIET="1")
        env["TEST_TMP"] = tmp
        p = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=env,
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if p.returncode != 0:
            raise AssertionError("the snippet exited %d:\n%s\n%s" % (p.returncode, p.stdout, p.stderr))
        data = None
        if os.path.exists(report):
            with open(report) as f:
                data = json.load(f)
        return data, p.stdout


def last_json(stdout):
    """The last line of ``stdout`` that is JSON (what the snippet printed for the test)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(("{", "[")):
            return json.loads(line)
    raise AssertionError("the snippet printed no JSON line:\n" + stdout)


def steps(report):
    return [s["step"] for s in report.get("steps", [])]


def phases(report):
    """{phase path: count}."""
    return {p["path"]: p["count"] for p in report.get("phases", [])}


def source(report, name):
    """The report's status of source ``name``, or None."""
    return next((s for s in report.get("sources", []) if s["name"] == name), None)
