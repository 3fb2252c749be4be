#!/usr/bin/env bash
# The speed issue's table on one H200, each row as a user types it, every figure from the tool's own JSON:
#   run(command="bash benchmarks/gpu/speed_h200.sh", timeout_s=600)
# $OUT then holds speed.tgz (every JSON, log and the profile summary) and table.md.
# Parts, most wanted first (PARTS="..." runs a subset); each bounded by `timeout` and skipped when less than its
# cap is left of BUDGET_S (default 570), so the call ends with what it has:
#   A  the anchors (benchmarks/gpu/anchors.py): import torch, import torch._dynamo, making a compiled function
#   P  pipeline --preset small --device cuda (its defaults: batch 16, the dense stretches compiled)
#   R  repro --threads 3 --device cuda (first verdict)
#   G  guards
#   M  repro --device cuda --model benchmarks.gpu.user_models:mlp, then :attention
#   X  repro --threads 3 --shapes per-thread --matrix --device cuda
#   E  pipeline --preset small --device cuda --no-compile-dense (the same run as before the change: the A/B)
#   F  the profile of P's run (benchmarks/gpu/profile_pipeline.py)
#   B  P at --batch-size 32 (does a larger batch still pay, once the layers are fused?)
# Every command gets fresh inductor and triton caches: a user's first run. Wall seconds per part in $OUT/steps.log;
# `python3 benchmarks/gpu/speed_table.py $OUT` renders the table.
set -u
OUT="${OUT:-$(mktemp -d)}"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DD="python3 -m dflash_doctor"
PARTS="${PARTS:-P R G M X E F}"
BUDGET_S="${BUDGET_S:-570}"
START=$(date +%s)
python3 -c 'import torch, triton, sys; print("torch", torch.__version__, "triton", triton.__version__, "python", sys.version.split()[0], torch.cuda.get_device_name())' | tee "$OUT/env.txt"
nproc >>"$OUT/env.txt"
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
fresh_cache() { export TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)"; export TRITON_CACHE_DIR="$TORCHINDUCTOR_CACHE_DIR/triton"; }
# timed NAME CAP COMMAND...: run it under `timeout CAP` with fresh caches, if CAP still fits the budget
timed() {
  local name=$1 cap=$2; shift 2
  if [ "$(left)" -lt "$cap" ]; then echo "$name skipped: $(left) s left, cap $cap s" | tee -a "$OUT/steps.log"; return; fi
  fresh_cache
  local began=$(date +%s.%N)
  timeout "$cap" "$@" >"$OUT/$name.stdout" 2>"$OUT/$name.stderr"
  local rc=$?
  echo "$name exit $rc wall $(python3 -c "print(round($(date +%s.%N) - $began, 2))") s" | tee -a "$OUT/steps.log"
}
for p in $PARTS; do case "$p" in
A) began=$(date +%s.%N); python3 benchmarks/gpu/anchors.py >"$OUT/A_anchors.json" 2>"$OUT/A_anchors.stderr"
   echo "A_anchors exit $? wall $(python3 -c "print(round($(date +%s.%N) - $began, 2))") s" | tee -a "$OUT/steps.log" ;;
P) timed P_small 150 $DD pipeline --preset small --device cuda -f json -o "$OUT/P_small.json" ;;
R) timed R_default 100 $DD repro --threads 3 --device cuda -f json -o "$OUT/R_default.json" ;;
G) timed G_guards 60 $DD guards -f json -o "$OUT/G_guards.json" ;;
M) for m in mlp attention; do
     timed "M_$m" 130 $DD repro --device cuda --model "benchmarks.gpu.user_models:$m" -f json -o "$OUT/M_$m.json"
   done ;;
X) # with the machine's CPU and GPU use sampled every 5 s beside it: is the matrix bound by the cores, the GPU or neither?
   (vmstat -n 5 >"$OUT/X_vmstat.txt" 2>&1 &) ; (nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 >"$OUT/X_gpu.csv" 2>&1 &)
   timed X_matrix 330 $DD repro --threads 3 --shapes per-thread --matrix --device cuda -f json -o "$OUT/X_matrix.json"
   pkill -f "vmstat -n 5" ; pkill -f "nvidia-smi --query-gpu" ;;
E) timed E_small_eager 120 $DD pipeline --preset small --device cuda --no-compile-dense -f json -o "$OUT/E_small_eager.json" ;;
B) timed B_small_batch32 150 $DD pipeline --preset small --device cuda --batch-size 32 -f json -o "$OUT/B_small_batch32.json" ;;
F) timed F_profile 130 python3 benchmarks/gpu/profile_pipeline.py --preset small --device cuda --steps 30 --from-step 15 --to-step 25 --out "$OUT/F_profile" ;;
esac; done
rm -f "$OUT"/F_profile/trace.json.gz 2>/dev/null  # tens of MB; summary.json and summary.md stay
python3 benchmarks/gpu/speed_table.py "$OUT" | tee "$OUT/table.md"
# The device tool brings back only a few files: everything goes back as one archive, beside the table.
(cd "$OUT" && tar czf speed.tgz --exclude=speed.tgz --exclude=table.md * && find . -mindepth 1 ! -name speed.tgz ! -name table.md -delete)
