#!/usr/bin/env bash
# `run --fix` against its baseline on one GPU (issue 36), on the plain loop of docs/races.md ("The plain loop"):
#   run(command="bash benchmarks/gpu/run_proof.sh", timeout_s=600)
# Steps (each bounded by `timeout`; every JSON lands in $OUT):
#   A  --fix non-lazy-backward, different shapes, 2 pairs, cold cache: the baseline deadlocks (DFD902) and the fix
#      arm is expected to raise the FX error instead (docs/races.md: non-lazy backward alone turns the deadlock into
#      the RuntimeError where the flag is a module global): deadlock holds-or-inconclusive, fx-flag-leak fails
#   B  --fix single-thread-autograd,threadlocal-flag, same shapes, 3 pairs, cold cache: expected deadlock holds
#      (baseline 3/3, fix 0/3) and overall holds or inconclusive for the leak the baseline never showed
#   C  the same as B with --amplify switch-interval: whether the amplifier changes a GPU run's rates
# About 6-8 minutes. STEPS="A B" runs a subset.
set -u
OUT="${OUT:-$(mktemp -d)}"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DD="python3 -m dflash_doctor"
STEPS="${STEPS:-A B C}"
python3 -c 'import torch, sys; print("torch", torch.__version__, "python", sys.version.split()[0], torch.cuda.get_device_name())' | tee "$OUT/env.txt"
step() { echo "== $1 $(date +%T)" | tee -a "$OUT/steps.log"; }
proof() {  # name, timeout, shapes, run options...
  local name=$1 limit=$2 shapes=$3; shift 3
  step "$name: run $* -- plain_loop.py --shapes $shapes"
  timeout "$limit" $DD run "$@" --cache cold --on-hang kill --hang-after 45 -f json -o "$OUT/${name}_run.json" -- \
    python3 benchmarks/gpu/plain_loop.py --shapes "$shapes" --hang-after 90 >"$OUT/$name.stdout" 2>"$OUT/$name.stderr"
  echo "$name exit $?" | tee -a "$OUT/steps.log"
  tail -2 "$OUT/$name.stderr" | tee -a "$OUT/steps.log"
}
for s in $STEPS; do case "$s" in
A) proof A 200 different --fix non-lazy-backward --trials 2 ;;
B) proof B 240 same --fix single-thread-autograd,threadlocal-flag --trials 3 ;;
C) proof C 240 same --fix single-thread-autograd,threadlocal-flag --trials 3 --amplify switch-interval ;;
esac; done
echo "results in $OUT"
