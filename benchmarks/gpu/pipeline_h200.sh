#!/usr/bin/env bash
# Issue 12: the reference pipeline at the seeds' scale on one H200 (torch 2.11+cu130, Python 3.12, no network).
# The lead runs it with the device tool, from the repository root:
#   run(command="bash benchmarks/gpu/pipeline_h200.sh", timeout_s=450)
# Four `dflash-doctor pipeline` runs, in this order, each from a cold inductor and triton cache (fresh folders), each
# capped by `timeout` so the whole script ends within 420 s even if every run hits its cap:
#   seeds-none       --preset seeds, no mitigation, 20 steps       5 target + 3 drafter threads on the one GPU, each
#                    (cap 125 s)                                    drafter compiling flex_attention fwd+bwd for a
#                                                                   shape of its own. Expected: a named failure, exit
#                                                                   1: DFD804 (compile_lock / autograd deadlock, the
#                                                                   stacks and the cycle) or DFD803 (the FX error in
#                                                                   a drafter, with the thread that held the flag).
#                                                                   --stall-timeout 30 (the stall clock starts after
#                                                                   set-up, and CPU use counts as progress).
#   seeds-fixed      the same with --mitigation threadlocal-flag,   Expected: exit 0, 20 steps; first step within
#                    non-lazy-backward (cap 110 s)                  60 s of the start (facts.warmup_s).
#   small-threads    --preset small, 1 target + 1 drafter thread,   Targets: MFU >= 30 % of the bf16 peak, warm-up
#                    60 steps (cap 85 s)                            (facts.warmup_s) <= 30 s.
#   small-processes  --preset small --workers processes, 60 steps   Target: tok/s >= 0.9x small-threads' (batches
#                    (cap 95 s)                                     through CUDA IPC: facts.transport "cuda-ipc").
# What comes back (the device tool returns at most 8 files): "$OUT/summary.md" (the table, each target checked;
# also printed), "$OUT/results.json" (every run's JSON report), "$OUT/runs.txt" (versions, each run's exit code and
# wall time) and "$OUT/pipeline-h200.tgz" (each run's JSON report and stderr log: set-up phases, step lines, the
# stall diagnosis). A report is written even when a run ends by timeout's SIGTERM (a partial report, exit 143);
# all four files are refreshed after every run, so a command cut short still brings back what finished.
#
# Dry run on a CPU (every path, tiny models, the same topologies):
#   PIPELINE_DEVICE=cpu bash benchmarks/gpu/pipeline_h200.sh
set -u
OUT="${OUT:-$(mktemp -d)}"
RUNS="$(mktemp -d)"  # each run's report and log, archived into $OUT after every run
PY="${PYTHON:-python3}"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DEVICE="${PIPELINE_DEVICE:-cuda}"
SMALL=small
SEEDS=seeds
SEEDS_TOPOLOGY=()
CAP_SCALE=1
if [ "$DEVICE" = cpu ]; then
  # The seeds' 5 + 3 topology with the tiny model: the small model's corpus alone is minutes of CPU decoding.
  SMALL=tiny
  SEEDS=tiny
  SEEDS_TOPOLOGY=(--target-devices cpu,cpu,cpu,cpu,cpu --drafter-devices cpu,cpu,cpu)
  CAP_SCALE="${PIPELINE_CAP_SCALE:-2}"
fi
START=$SECONDS

run_case() {  # name, cap (s), pipeline arguments...
  local name="$1" cap=$(( $2 * CAP_SCALE ))
  shift 2
  local began=$SECONDS
  TORCHINDUCTOR_CACHE_DIR="$RUNS/.cache-$name/inductor" TRITON_CACHE_DIR="$RUNS/.cache-$name/triton" \
    timeout -k 5 "$cap" "$PY" -m dflash_doctor pipeline --device "$DEVICE" "$@" \
    --format json --output "$RUNS/$name.json" 2>"$RUNS/$name.log"
  local rc=$?
  echo "$name rc=$rc wall=$((SECONDS - began))s cap=${cap}s args=$*" >>"$RUNS/runs.txt"
  rm -rf "$RUNS/.cache-$name"
  publish >/dev/null
}

publish() {  # the table from what has run so far, and the four files that come back
  "$PY" benchmarks/gpu/pipeline_table.py "$RUNS" >"$RUNS/summary.md"
  cp "$RUNS/summary.md" "$RUNS/results.json" "$OUT/"
  cat "$RUNS/env.txt" "$RUNS/runs.txt" >"$OUT/runs.txt"
  tar czf "$OUT/pipeline-h200.tgz" -C "$RUNS" --exclude='.cache-*' .
  cat "$RUNS/summary.md"
}

: >"$RUNS/runs.txt"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")' >"$RUNS/env.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$RUNS/env.txt" 2>&1
# PIPELINE_CASES="small-threads small-processes" runs only the named cases; PIPELINE_SMALL_ARGS="--batch-size 32"
# adds arguments to the small runs (how a preset change was measured before it became the default).
CASES=" ${PIPELINE_CASES:-seeds-none seeds-fixed small-threads small-processes} "
read -r -a SMALL_ARGS <<<"${PIPELINE_SMALL_ARGS:-}"
want() { [[ "$CASES" == *" $1 "* ]]; }
want seeds-none && run_case seeds-none 125 --preset "$SEEDS" "${SEEDS_TOPOLOGY[@]}" --steps 20 --stall-timeout 30
want seeds-fixed && run_case seeds-fixed 110 --preset "$SEEDS" "${SEEDS_TOPOLOGY[@]}" --steps 20 \
  --stall-timeout 30 --mitigation threadlocal-flag,non-lazy-backward
want small-threads && run_case small-threads 85 --preset "$SMALL" --workers threads --steps 60 "${SMALL_ARGS[@]}"
want small-processes && run_case small-processes 95 --preset "$SMALL" --workers processes --steps 60 \
  "${SMALL_ARGS[@]}"
want small-threads-b64 && run_case small-threads-b64 90 --preset "$SMALL" --workers threads --steps 60 \
  --batch-size 64
echo "script wall $((SECONDS - START))s" >>"$RUNS/runs.txt"
publish
cat "$OUT/runs.txt"
rm -rf "$RUNS"
