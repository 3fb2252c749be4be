#!/usr/bin/env bash
# Issue 4: the reference pipeline's throughput and model FLOP utilisation on one H200 (torch 2.11+cu130,
# Python 3.12, no network). The lead runs it with the device tool, from the repository root:
#   run(command="bash benchmarks/gpu/pipeline_small.sh", timeout_s=300)
# Three `dflash-doctor pipeline` runs, each capped by `timeout` and by what is left of a 230 s budget:
#   small-threads     --preset small --workers threads     1 target + 1 drafter thread, compiled flex fwd+bwd
#   small-processes   --preset small --workers processes   the same roles as 2 ranks (gloo, host-staged: NCCL
#                                                          refuses two ranks on one GPU)
#   seeds-threads     --preset seeds --workers threads     5 target + 3 drafter threads on the one GPU;
#                                                          docs/races.md predicts a deadlock (3 drafter threads
#                                                          compiling flex fwd+bwd), reported as "hung" by the
#                                                          stall watchdog, exit 1
# Each run's JSON report lands in "$OUT/<run>.json", its stderr (step lines) in "$OUT/<run>.log"; a table is
# printed and written to "$OUT/summary.md", all facts to "$OUT/results.json".
# The inductor cache is fresh per run (cold compiles, like the seeds after their cache was deleted).
# Dry run on a CPU box: PIPELINE_DEVICE=cpu PIPELINE_SMALL=tiny PIPELINE_SEEDS=tiny bash benchmarks/gpu/pipeline_small.sh
set -u
OUT="${OUT:-$(mktemp -d)}"
PY="${PYTHON:-python3}"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DEVICE="${PIPELINE_DEVICE:-cuda}"
SMALL="${PIPELINE_SMALL:-small}"
SEEDS="${PIPELINE_SEEDS:-seeds}"
STEPS="${PIPELINE_STEPS:-30}"
BUDGET="${PIPELINE_BUDGET_S:-450}"
START=$SECONDS
: >"$OUT/runs.txt"

# PIPELINE_CASES="small-threads small-processes" runs only the named cases; empty runs all.
CASES="${PIPELINE_CASES:-}"

run_case() {  # name, cap (s), pipeline arguments...
  local name="$1" cap="$2"
  shift 2
  if [ -n "$CASES" ] && [[ " $CASES " != *" $name "* ]]; then return; fi
  local left=$((BUDGET - (SECONDS - START)))
  if [ "$left" -lt 20 ]; then
    echo "$name skipped (budget spent)" >>"$OUT/runs.txt"
    return
  fi
  [ "$cap" -gt "$left" ] && cap=$left
  local began=$SECONDS
  TORCHINDUCTOR_CACHE_DIR="$OUT/.inductor-$name" timeout -k 5 "$cap" \
    "$PY" -m dflash_doctor pipeline --device "$DEVICE" "$@" --format json --output "$OUT/$name.json" \
    2>"$OUT/$name.log"
  local rc=$?
  echo "$name rc=$rc wall=$((SECONDS - began))s cap=${cap}s" >>"$OUT/runs.txt"
  rm -rf "$OUT/.inductor-$name"
}

"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")' >"$OUT/env.txt" 2>&1
run_case small-threads 170 --preset "$SMALL" --workers threads --steps "$STEPS"
run_case small-processes 170 --preset "$SMALL" --workers processes --steps "$STEPS"
run_case seeds-threads 100 --preset "$SEEDS" --workers threads --steps 10 --stall-timeout 60
"$PY" benchmarks/gpu/pipeline_table.py "$OUT" | tee "$OUT/summary.md"
cat "$OUT/env.txt" "$OUT/runs.txt"
