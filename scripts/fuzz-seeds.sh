#!/usr/bin/env bash
# Seeds the diagnose_log fuzz target with every OOM corpus text (one file per case), so libFuzzer
# mutates real messages instead of starting from nothing. Usage: scripts/fuzz-seeds.sh [DIR]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$root/profiler/fuzz/libfuzzer/corpus/diagnose_log}"
mkdir -p "$dir"
python3 - "$root/profiler/analysis/tests/fixtures/oom-corpus" "$dir" <<'PY'
import json, pathlib, sys
src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
n = 0
for f in sorted(src.glob("*.jsonl")):
    for line in f.read_text().splitlines():
        if line.strip():
            case = json.loads(line)
            (out / case["id"]).write_text(case["text"])
            n += 1
print(f"{n} seeds in {out}")
PY
