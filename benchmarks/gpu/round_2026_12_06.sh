#!/usr/bin/env bash
# The device round of 2026-12-06 (one H100, torch 2.11 + cu130): issues 34, 35 and 37, one block each. The lead
# runs it with the device tool, carrying the py-spy wheel (git-ignored .whl/):
#   run(command="bash benchmarks/gpu/round_2026_12_06.sh", carry=[".whl"], timeout_s=600)
# Every step is bounded by `timeout` and by the round's budget (ROUND_BUDGET_S, default 540 s from the start): a
# block that cannot get its minimum is skipped and says so. Each step's JSON and stderr tail go to a scratch folder;
# at the end round_bundle.py folds them into at most 5 JSON files under $OUT (env, one per block), and
# round_2026_12_06_table.py renders the tables for docs/gpu-results.md from them.
#   B  issue 35: repro --mode dataparallel (every form, 3 replicas on GPU 0), then `run` on the shipped
#      DataParallel-over-compiled script (uncaught and --catch), and the recommended fix (compile outside) under run
#   C  issue 37: run --cache cold --on-hang kill on the deadlock loop; then the loop started without the tool and
#      `attach PID` three times on the same hung process (the cycle must be named the same way each time)
#   A  issue 34: the repro matrix rows with non-lazy-backward on 2.11 (and the plain baseline) still as before
#   G  issue 34: guards on 2.11 (settings process-wide, no DFD611) and the pipeline with the non-lazy fix
#   T  issue 37: run --on-hang kill over torchrun's two workers; then whether any process still holds the GPU
#   D  issue 35 after DFD911: run on the DataParallel-over-compiled loop, uncaught and caught
#   P  issue 36: run --fix single-thread-autograd,threadlocal-flag against its baseline, 3 pairs, on the plain loop
#   H  (not in the default; needs its own device time) held-out trainers the project never tuned on: copied by the
#      lead into the git-ignored .gpu/heldout_dp/ and carried (carry=[".whl", ".gpu"]); each runs plain (the
#      truth: exit code, stderr tail) and under `run`, then `logs` reads the plain run's stderr
#   S  issue 41: the floors and the verdict targets in one run, as ratios: benchmarks/gpu/anchors.py (import torch,
#      torch._dynamo), then benchmarks/speed_ratios.py --device cuda (one cold compile of repro's step in a fresh
#      process, the import floor, `repro --threads 3` to its verdict, `guards`, the per-thread matrix); ~400 s
#   Q  issue 41: `pipeline --preset small` with threads then processes (MFU, warm-up, the throughput ratio), then
#      benchmarks/run_overhead.py --device cuda --preset small (run's share of a training step); ~450 s
# BLOCKS="B C" runs a subset, in the order given. The three blocks may need more than one call's 540 s (A3 alone
# may take 150 s): run BLOCKS="B C" and BLOCKS="A" as two calls if the first one skipped A's rows.
set -u
START=$(date +%s)
BUDGET="${ROUND_BUDGET_S:-540}"
OUT="${OUT:-$(mktemp -d)}"
WORK="$(mktemp -d)"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
DD="python3 -m dflash_doctor"
BLOCKS="${BLOCKS:-B C A}"  # G and T: the second call of the day (BLOCKS="A G T")

left() { echo $(( BUDGET - ($(date +%s) - START) )); }
# step NAME LIMIT_S MIN_S CMD...: runs CMD bounded by min(LIMIT_S, what is left - 15 s for the bundling), or skips
# it when less than MIN_S is left; its exit code, seconds and stderr tail go to $WORK/NAME.meta.json
step() {
  local name=$1 limit=$2 minimum=$3; shift 3
  local avail=$(( $(left) - 15 ))
  if [ "$avail" -lt "$minimum" ]; then
    echo "{\"step\": \"$name\", \"skipped\": \"$avail s left, $minimum s needed\"}" >"$WORK/$name.meta.json"
    echo "== $name skipped ($avail s left)"; return 0
  fi
  [ "$limit" -gt "$avail" ] && limit=$avail
  echo "== $name (limit $limit s, $(left) s left) $(date +%T)"
  local t0=$(date +%s.%N)
  timeout -k 5 "$limit" "$@" >"$WORK/$name.stdout" 2>"$WORK/$name.stderr"
  local rc=$?
  python3 benchmarks/gpu/round_bundle.py meta "$WORK" "$name" "$rc" "$t0" "$limit" "$*"
  echo "   $name exit $rc"
}
fresh_cache() { export TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)"; export TRITON_CACHE_DIR="$TORCHINDUCTOR_CACHE_DIR/triton"; }

python3 - "$OUT/env.json" <<'PY'
import json, sys, torch
json.dump({"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
           "gpus": torch.cuda.device_count()}, open(sys.argv[1], "w"))
PY
if ! command -v py-spy >/dev/null; then
  pip install --no-index --quiet --target /tmp/site .whl/py_spy-0.4.3-*.whl >"$WORK/py-spy-install.txt" 2>&1 \
    && export PATH="/tmp/site/bin:$PATH" PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
py-spy --version >"$WORK/py-spy-version.txt" 2>&1 || echo "py-spy missing: the attach steps will say so"

for block in $BLOCKS; do case "$block" in
B)  # issue 35: DataParallel over a compiled model, replicas on GPU 0 repeated
  step B1_repro_dataparallel 200 90 $DD repro --mode dataparallel --threads 3 --device cuda --steps 3 \
    --timeout 150 -f json -o "$WORK/B1_repro_dataparallel.json"
  step B2_run_inside 70 40 $DD run --cache cold -f json -o "$WORK/B2_run_inside.json" -- \
    python3 benchmarks/gpu/dataparallel_loop.py --form inside
  step B3_run_inside_caught 70 40 $DD run --cache cold -f json -o "$WORK/B3_run_inside_caught.json" -- \
    python3 benchmarks/gpu/dataparallel_loop.py --form inside --catch
  step B4_run_outside_fix 70 40 $DD run --cache cold --expect clean -f json -o "$WORK/B4_run_outside_fix.json" -- \
    python3 benchmarks/gpu/dataparallel_loop.py --form outside
  ;;
C)  # issue 37: the deadlock loop under run, then attach three times on one hung loop started without the tool
  step C1_run_deadlock 90 45 $DD run --cache cold --on-hang kill --hang-after 60 -f json -o "$WORK/C1_run_deadlock.json" -- \
    python3 benchmarks/gpu/plain_loop.py --shapes same --hang-after 80 --out "$WORK/C1_loop.json"
  if [ $(( $(left) - 15 )) -ge 60 ]; then
    ( fresh_cache; exec python3 benchmarks/gpu/plain_loop.py --shapes same --hang-after 200 --out "$WORK/C_loop.json" ) \
      >"$WORK/C_loop.stdout" 2>"$WORK/C_loop.stderr" &
    LOOP=$!
    sleep 25  # the cycle forms 17-22 s after start on the H100 (docs/gpu-results.md)
    for i in 1 2 3; do
      step "C2_attach_$i" 30 20 $DD attach "$LOOP" --samples 2 --interval 2 -f json -o "$WORK/C2_attach_$i.json"
    done
    kill -9 "$LOOP" 2>/dev/null; wait "$LOOP" 2>/dev/null
  else
    echo '{"step": "C2_attach", "skipped": "less than 60 s left"}' >"$WORK/C2_attach.meta.json"
  fi
  ;;
A)  # issue 34: the matrix rows that use non-lazy-backward, on 2.11, against a plain baseline
  step A1_repro_baseline 60 35 $DD repro --threads 3 --shapes per-thread --device cuda --trials 1 --max-time 50 \
    -f json -o "$WORK/A1_repro_baseline.json"
  step A2_repro_non_lazy 100 60 $DD repro --threads 3 --shapes per-thread --device cuda --trials 2 --max-time 90 \
    --mitigation non-lazy-backward -f json -o "$WORK/A2_repro_non_lazy.json"
  step A3_repro_shim_non_lazy 160 80 $DD repro --threads 3 --shapes per-thread --device cuda --trials 2 --max-time 150 \
    --mitigation threadlocal-flag,non-lazy-backward -f json -o "$WORK/A3_repro_shim_non_lazy.json"
  ;;
G)  # issue 34: guards reads 2.11's settings as process-wide (no DFD611); the pipeline with the non-lazy fix trains
  step G1_guards 60 20 $DD guards -f json -o "$WORK/G1_guards.json"
  ( fresh_cache; step G2_pipeline_non_lazy 200 90 $DD pipeline --preset small --device cuda --steps 20 \
      --mitigation threadlocal-flag,non-lazy-backward -f json -o "$WORK/G2_pipeline_non_lazy.json" )
  ;;
T)  # issue 37: --on-hang kill under torchrun ends every worker (own processes, the deadlocked ones included)
  ( fresh_cache; step T1_run_torchrun_kill 120 60 $DD run --cache cold --on-hang kill --hang-after 60 -f json \
      -o "$WORK/T1_run_torchrun_kill.json" -- torchrun --standalone --nproc-per-node 2 \
      benchmarks/gpu/plain_loop.py --shapes same --hang-after 90 --out "$WORK/T1_loop_rank.json" )
  sleep 3
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader >"$WORK/T2_gpu_holders.txt" 2>&1
  ps -eo pid,args | grep -c "[p]lain_loop.py" >"$WORK/T2_left.txt"
  python3 - "$WORK" <<'PY'
import json, sys, time, pathlib
work = pathlib.Path(sys.argv[1])
holders = [l for l in (work / "T2_gpu_holders.txt").read_text().splitlines() if l.strip()]
left = int((work / "T2_left.txt").read_text().strip() or 0)
(work / "T2_after.meta.json").write_text(json.dumps({"step": "T2_after", "rc": 0, "seconds": 0, "limit_s": 0,
    "timed_out": False, "command": "nvidia-smi --query-compute-apps; ps | grep plain_loop.py",
    "stdout_tail": f"gpu holders: {holders}; plain_loop processes left: {left}", "stderr_tail": ""}))
PY
  ;;
D)  # issue 35, after DFD911: run names nn.DataParallel's replicas of a compiled module as such (uncaught and caught)
  ( fresh_cache; step D1_run_inside 70 40 $DD run --cache cold -f json -o "$WORK/D1_run_inside.json" -- \
      python3 benchmarks/gpu/dataparallel_loop.py --form inside )
  ( fresh_cache; step D2_run_inside_caught 70 40 $DD run --cache cold -f json -o "$WORK/D2_run_inside_caught.json" -- \
      python3 benchmarks/gpu/dataparallel_loop.py --form inside --catch )
  ;;
P)  # issue 36: run --fix against its baseline on the plain loop (same shapes: the baseline deadlocks)
  ( fresh_cache; step P1_run_fix_proof 240 120 $DD run --fix single-thread-autograd,threadlocal-flag --trials 3 \
      --cache cold --on-hang kill --hang-after 45 -f json -o "$WORK/P1_run_fix_proof.json" -- \
      python3 benchmarks/gpu/plain_loop.py --shapes same --hang-after 90 )
  ;;
H)  # held-out trainers: truth (plain) then the tool, each bounded; skipped where the folder was not carried
  HELD=.gpu/heldout_dp
  if [ -d "$HELD" ]; then
    for spec in ${HELD_SPECS:-"hf:hf_style_trainer.py --torch_compile --data_parallel_replicas 3" \
                "dp:dp_compiled.py --replicas 3" "executor:executor_trainer.py" "executor_varying:executor_trainer.py --varying" \
                "profiler:profiler_thread_trainer.py" "thread_args:thread_args_trainer.py"}; do
      name=${spec%%:*}; args=${spec#*:}
      ( fresh_cache; step "H_${name}_plain" 60 30 python3 $HELD/$args )
      ( fresh_cache; step "H_${name}_run" 70 30 $DD run --cache cold --on-hang kill --hang-after 40 -f json \
          -o "$WORK/H_${name}_run.json" -- python3 $HELD/$args )
      [ -f "$WORK/H_${name}_plain.stderr" ] && step "H_${name}_logs" 20 5 $DD logs "$WORK/H_${name}_plain.stderr" \
          -f json -o "$WORK/H_${name}_logs.json"
    done
  else
    echo '{"step": "H", "skipped": ".gpu/heldout_dp was not carried"}' >"$WORK/H.meta.json"
  fi
  ;;
S)  # issue 41: every floor and the targets measured against it in the same call
  step S1_anchors 120 40 python3 benchmarks/gpu/anchors.py
  cp "$WORK/S1_anchors.stdout" "$WORK/S1_anchors.json" 2>/dev/null
  # --budget-s: each of its children gets what is left of the step's limit; its JSON is rewritten after every row
  step S2_ratios 500 200 python3 benchmarks/speed_ratios.py --device cuda --profile --budget-s 480 \
    --json "$WORK/S2_ratios.json"
  ;;
Q)  # issue 41: the pipeline's MFU, warm-up and threads against processes; run's share of a step
  ( fresh_cache; step Q1_pipeline_threads 170 90 $DD pipeline --preset small --device cuda -f json \
      -o "$WORK/Q1_pipeline_threads.json" )
  ( fresh_cache; step Q2_pipeline_processes 170 90 $DD pipeline --preset small --device cuda --workers processes \
      -f json -o "$WORK/Q2_pipeline_processes.json" )
  ( fresh_cache; step Q3_run_overhead 200 90 python3 benchmarks/run_overhead.py --device cuda --preset small \
      --pairs 2 --rounds 3 --steps 20 --json "$WORK/Q3_run_overhead.json" )
  ;;
esac; done

python3 benchmarks/gpu/round_bundle.py bundle "$WORK" "$OUT"
python3 benchmarks/gpu/round_2026_12_06_table.py "$OUT"
echo "round: $(( $(date +%s) - START )) s"
