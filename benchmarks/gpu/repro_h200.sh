#!/usr/bin/env bash
# The verdicts issue on one H200: the plain loop's truth for every row of docs/races.md's table, then
# `dflash-doctor repro` with the options a user types, then the table from both tools' own JSON.
#   run(command="bash benchmarks/gpu/repro_h200.sh", timeout_s=600)
# About 7 minutes: the loop cases 6 at a time (~75 s), then the repro runs one after another (~30 s for the
# defaults, under 300 s for the matrix). REPRO_CASES=repro_rows runs the repro part alone. Everything lands in
# $OUT (one archive plus the table).
set -u
OUT="${OUT:-$(mktemp -d)}"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -c 'import torch, triton, sys; print("torch", torch.__version__, "triton", triton.__version__, "python", sys.version.split()[0], torch.cuda.get_device_name())' | tee "$OUT/env.txt"
nvidia-smi --query-gpu=driver_version --format=csv,noheader >>"$OUT/env.txt" 2>&1
nproc >>"$OUT/env.txt"
CASES="${REPRO_CASES:-loop_truth repro_rows}"
for cases in $CASES; do
  parallel=1; [ "$cases" = loop_truth ] && parallel=6
  python3 benchmarks/gpu/run_cases.py "benchmarks/gpu/cases/$cases.txt" "$OUT/$cases" --parallel "$parallel"
  python3 benchmarks/gpu/summarize_cases.py "$OUT/$cases" | cut -c1-400
  tar czf "$OUT/repro-evidence.tgz" -C "$OUT" $(cd "$OUT" && ls -d loop_truth repro_rows 2>/dev/null) env.txt
done
python3 benchmarks/gpu/repro_table.py "$OUT" | tee "$OUT/table.md"
