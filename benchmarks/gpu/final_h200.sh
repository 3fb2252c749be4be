#!/usr/bin/env bash
# One device call for what is left: the pipeline evidence (benchmarks/gpu/pipeline_h200.sh, at most 420 s), then
# `repro --threads 3` with every default once more (about 35 s), since the reference model's code changed after
# the verdicts table was measured.
#   run(command="bash benchmarks/gpu/final_h200.sh", timeout_s=590)
set -u
OUT="${OUT:-$(mktemp -d)}"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="$OUT" bash benchmarks/gpu/pipeline_h200.sh
python3 benchmarks/gpu/run_cases.py benchmarks/gpu/cases/repro_default.txt "$OUT/repro_recheck" --parallel 1
python3 benchmarks/gpu/summarize_cases.py "$OUT/repro_recheck" | cut -c1-600
