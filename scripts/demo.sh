#!/usr/bin/env bash
# `make demo`: runs the demo training job under the memsight sidecar (`memsight run`), then
# summarizes its report.
# With a terminal the progress is shown as it runs; without one (CI, pipes) it runs headless.
# The last line printed is always the report's path.
set -euo pipefail
out="${1:-out}"
report="$(cd "$out" && pwd)/demo-report.json"
bin=./target/release
if [ -t 1 ]; then
    echo "memsight demo: training a small MLP under memsight with the live viewer (q closes it; the job's output goes to ${report%.json}.log)"
    "$bin/memsight" run --live --report "$report" -- "$bin/examples/train_mlp" 300 >&2
else
    "$bin/memsight" run --report "$report" -- "$bin/examples/train_mlp" 300 >"$out/demo.log" 2>&1 || { cat "$out/demo.log" >&2; exit 1; }
fi
"$bin/memsight" summary --format markdown "$report" > "$out/demo-summary.md"
"$bin/memsight" summary --format svg -o "$out/demo-timeline.svg" "$report" >/dev/null
if [ -t 1 ]; then cat "$out/demo-summary.md"; fi
echo "summary: $out/demo-summary.md, plot: $out/demo-timeline.svg" >&2
echo "$report"
