#!/usr/bin/env bash
# `make demo`: trains the reference GPT (tiny preset, reference-model/) under the memsight sidecar
# (`memsight run`), with the live viewer when there is a terminal, headless otherwise; then
# summarizes the report. The last line printed is always the report's path.
set -euo pipefail
out="${1:-out}"
out="$(cd "$out" && pwd)"
report="$out/demo-report.json"
bin=./target/release
job=("$bin/memsight-gpt" train --preset tiny --steps "${DEMO_STEPS:-500}" --save "$out/demo-gpt.safetensors")
if [ -t 1 ]; then
    echo "memsight demo: training the reference GPT (tiny) under memsight with the live viewer (q closes it; the job's output goes to ${report%.json}.log)"
    "$bin/memsight" run --live --report "$report" -- "${job[@]}" >&2
else
    "$bin/memsight" run --report "$report" -- "${job[@]}" >"$out/demo.log" 2>&1 || { cat "$out/demo.log" >&2; exit 1; }
fi
"$bin/memsight" summary --format markdown "$report" > "$out/demo-summary.md"
"$bin/memsight" summary --format svg -o "$out/demo-timeline.svg" "$report" >/dev/null
if [ -t 1 ]; then cat "$out/demo-summary.md"; fi
echo "summary: $out/demo-summary.md, plot: $out/demo-timeline.svg" >&2
echo "$report"
