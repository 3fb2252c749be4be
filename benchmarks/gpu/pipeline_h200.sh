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
# Each run's JSON report lands in "$OUT/<run>.json" (written even when a run ends by timeout's SIGTERM: a partial
# report, exit 143), its stderr (set-up phases, step lines) in "$OUT/<run>.log"; the table (with each target
# checked) is printed and written to "$OUT/summary.md", all facts to "$OUT/results.json".
#
# Dry run on a CPU (every path, tiny models, the same topologies):
#   PIPELINE_DEVICE=cpu bash benchmarks/gpu/pipeline_h200.sh
set -u
OUT="${OUT:-$(mktemp -d)}"
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
: >"$OUT/runs.txt"

run_case() {  # name, cap (s), pipeline arguments...
  local name="$1" cap=$(( $2 * CAP_SCALE ))
  shift 2
  local began=$SECONDS
  TORCHINDUCTOR_CACHE_DIR="$OUT/.cache-$name/inductor" TRITON_CACHE_DIR="$OUT/.cache-$name/triton" \
    timeout -k 5 "$cap" "$PY" -m dflash_doctor pipeline --device "$DEVICE" "$@" \
    --format json --output "$OUT/$name.json" 2>"$OUT/$name.log"
  local rc=$?
  echo "$name rc=$rc wall=$((SECONDS - began))s cap=${cap}s args=$*" >>"$OUT/runs.txt"
  rm -rf "$OUT/.cache-$name"
}

"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")' >"$OUT/env.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$OUT/env.txt" 2>&1
run_case seeds-none 125 --preset "$SEEDS" "${SEEDS_TOPOLOGY[@]}" --steps 20 --stall-timeout 30
run_case seeds-fixed 110 --preset "$SEEDS" "${SEEDS_TOPOLOGY[@]}" --steps 20 --stall-timeout 30 \
  --mitigation threadlocal-flag,non-lazy-backward
run_case small-threads 85 --preset "$SMALL" --workers threads --steps 60
run_case small-processes 95 --preset "$SMALL" --workers processes --steps 60
echo "script wall $((SECONDS - START))s" >>"$OUT/runs.txt"
"$PY" benchmarks/gpu/pipeline_table.py "$OUT" | tee "$OUT/summary.md"
cat "$OUT/env.txt" "$OUT/runs.txt"
