#!/usr/bin/env bash
# Issue 6: live NVML mode of `dflash-doctor gpus`, checked on the H200. The lead runs it with the device tool:
#   run(command="bash benchmarks/gpu/nvml_live.sh", timeout_s=120)
# Everything lands in "$OUT" (8 files at most); it finishes in under a minute. On a machine without a GPU every
# step still runs and records why it could not check (exit codes in summary.txt).
#   1. nvidia-smi's own view (the CSV `gpus --from` reads, with header and memory.total)
#   2. gpus_bench.py: NVML in-process vs spawning nvidia-smi
#   3. `gpus --samples 5 --interval 0.2 --format json` on the machine as it is
#   4. the same while a child process holds 16 GiB at 0 % utilization: expect DFD401 on GPU 0, listing its PID,
#      name and thread count (and no DFD404: the holder is alive)
#   5. the step-1 CSV through `gpus --from`, to compare CSV and NVML readings of one machine
set -u
OUT="${OUT:-$(mktemp -d)}"
PY="${PYTHON:-python3}"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
SUMMARY="$OUT/summary.txt"
ERR="$OUT/stderr.log"
: >"$SUMMARY"
step() { echo "$1 rc=$2" >>"$SUMMARY"; }

timeout 15 nvidia-smi --query-gpu=index,name,memory.used,memory.total,utilization.gpu --format=csv \
  >"$OUT/nvidia_smi.csv" 2>>"$ERR"
step nvidia-smi $?

timeout 25 "$PY" benchmarks/gpus_bench.py --rounds 200 --json "$OUT/gpus_bench.json" >"$OUT/gpus_bench.md" 2>>"$ERR"
step gpus_bench $?

timeout 15 "$PY" -m dflash_doctor gpus --samples 5 --interval 0.2 --format json >"$OUT/gpus_idle.json" 2>>"$ERR"
step "gpus (as is)" $?

READY="$OUT/.holder_ready"
"$PY" - "$READY" <<'PYEOF' 2>>"$ERR" &
import sys, time
import torch
block = torch.empty(16 * 2 ** 30, dtype=torch.uint8, device="cuda:0")  # held, never used: 0 % utilization
open(sys.argv[1], "w").write("ready")
time.sleep(40)
PYEOF
HOLDER=$!
for _ in $(seq 1 150); do [ -f "$READY" ] && break; kill -0 "$HOLDER" 2>/dev/null || break; sleep 0.2; done
if [ -f "$READY" ]; then
  timeout 15 "$PY" -m dflash_doctor gpus --samples 5 --interval 0.2 --format json >"$OUT/gpus_held.json" 2>>"$ERR"
  step "gpus (16 GiB held idle by pid $HOLDER)" $?
else
  step "gpus (holder could not allocate on cuda:0, see stderr.log)" 99
fi
kill "$HOLDER" 2>/dev/null
wait "$HOLDER" 2>/dev/null
rm -f "$READY"

timeout 15 "$PY" -m dflash_doctor gpus --from "$OUT/nvidia_smi.csv" --format json >"$OUT/gpus_csv.json" 2>>"$ERR"
step "gpus --from nvidia_smi.csv" $?
cat "$SUMMARY"
