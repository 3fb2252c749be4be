#!/usr/bin/env bash
# Issues 24 and 25 on one H200 (torch 2.11+cu130, no network): single-threaded autograd through repro's ladder and
# the reference pipeline, and the FX patcher race in the pipeline with and without isolate-fx-patches.
# The lead runs it with the device tool, from the repository root:
#   run(command="bash benchmarks/gpu/registry_h200.sh", timeout_s=600)
# Every command is capped by `timeout`; the caps add up to 425 s (the usual wall is less):
#   (a) repro-sta       repro --threads 3 --device cuda --shapes per-thread --trials 2 --mitigation
#       repro-sta-shim  single-thread-autograd | single-thread-autograd,threadlocal-flag: each row's ladder
#                       (natural, amplified; + forced, stuck for the pair) beside its own baseline under the same
#                       stresses, per-stress counts and the row's steps/s. The two run side by side (--jobs 4 each),
#                       capped at 210 s together.
#   (b) seeds-winner    pipeline --preset seeds --steps 20 --mitigation W, W = threadlocal-flag,single-thread-autograd
#                       unless (a) says that pair fails, else threadlocal-flag,non-lazy-backward;
#       seeds-nonlazy   and the same with threadlocal-flag,non-lazy-backward, the cost to compare with (caps 60 and
#                       55 s; the second is skipped when W is that pair already).
#   (c) trace-none      pipeline --preset seeds --steps 20 --tracing-thread --mitigation W: expected to lose a worker
#                       to the FX patcher race (NameError / CURRENT_PATCHER AssertionError), exit 1 (cap 100 s: the seeds warm-up alone takes 35-42 s there);
#       trace-isolated  the same with W,isolate-fx-patches: expected to train 20 steps, exit 0 (cap 60 s).
# What comes back: $OUT/results.json (every run's own JSON report by name), $OUT/runs.txt (versions, each run's exit
# code and wall), $OUT/table.md (benchmarks/gpu/registry_table.py's tables for docs/gpu-results.md) and
# $OUT/registry-h200.tgz (the reports and stderr logs). All four are refreshed after every step, so a call cut short
# still brings back what finished. Render again later with:
#   python3 benchmarks/gpu/registry_table.py OUT_DIR > table.md
# Dry run on a CPU (tiny models, no backward, so no deadlock; every path and file): REGISTRY_DEVICE=cpu bash ...
set -u
OUT="${OUT:-$(mktemp -d)}"
RUNS="$(mktemp -d)"
PY="${PYTHON:-python3}"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DEVICE="${REGISTRY_DEVICE:-cuda}"
SEEDS=(--preset seeds)
REPRO_DEVICE=(--device cuda)
SCALE=1
if [ "$DEVICE" = cpu ]; then
  SEEDS=(--preset tiny)
  REPRO_DEVICE=(--device cpu --preset tiny --steps 1)
  SCALE="${REGISTRY_CAP_SCALE:-3}"
fi
START=$SECONDS

publish() {  # results.json first: the table is rendered from it
  "$PY" - "$RUNS" <<'EOF'
import json, sys
from pathlib import Path
runs = Path(sys.argv[1])
reports = {}
for path in sorted(runs.glob("*.json")):
    if path.name == "results.json":
        continue
    try:
        reports[path.stem] = json.loads(path.read_text())
    except ValueError as exc:  # a run killed before it wrote: say so, keep the others
        reports[path.stem] = {"unreadable": str(exc)}
(runs / "results.json").write_text(json.dumps(reports, indent=1))
EOF
  "$PY" benchmarks/gpu/registry_table.py "$RUNS" >"$RUNS/table.md" 2>>"$RUNS/runs.txt"
  cp "$RUNS/results.json" "$RUNS/table.md" "$OUT/"
  cat "$RUNS/env.txt" "$RUNS/runs.txt" >"$OUT/runs.txt"
  tar czf "$OUT/registry-h200.tgz" -C "$RUNS" --exclude='.cache-*' .
}

# REGISTRY_CASES="trace-none" runs only the named cases (WINNER= names the mitigation then); empty runs all.
CASES="${REGISTRY_CASES:-}"
run_case() {  # name, cap (s), command (dflash-doctor arguments)...
  local name="$1" cap=$(( $2 * SCALE ))
  shift 2
  if [ -n "$CASES" ] && [[ " $CASES " != *" $name "* ]]; then return; fi
  local began=$SECONDS
  TORCHINDUCTOR_CACHE_DIR="$RUNS/.cache-$name/inductor" TRITON_CACHE_DIR="$RUNS/.cache-$name/triton" \
    timeout -k 5 "$cap" "$PY" -m dflash_doctor "$@" --format json --output "$RUNS/$name.json" 2>"$RUNS/$name.log"
  local rc=$?
  echo "$name rc=$rc wall=$((SECONDS - began))s cap=${cap}s args=$*" >>"$RUNS/runs.txt"
  rm -rf "$RUNS/.cache-$name"
}

: >"$RUNS/runs.txt"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")' >"$RUNS/env.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$RUNS/env.txt" 2>&1
nproc >>"$RUNS/env.txt"

# (a) the two repro rows side by side; --hang-after 30: the lock cycle is named from two stack samples at once,
# the silence fallback only matters for a hang without a cycle.
REPRO=(repro --threads 3 "${REPRO_DEVICE[@]}" --shapes per-thread --trials 2 --jobs 4 --hang-after 30 --timeout 110)
run_case repro-sta 210 "${REPRO[@]}" --mitigation single-thread-autograd &
run_case repro-sta-shim 210 "${REPRO[@]}" --mitigation single-thread-autograd,threadlocal-flag &
wait
publish

[ -n "${WINNER:-}" ] || WINNER=$("$PY" - "$RUNS/repro-sta-shim.json" <<'EOF'
import json, sys
try:
    failed = json.load(open(sys.argv[1]))["facts"].get("outcome") == "fails"
except (OSError, ValueError, KeyError):
    failed = False  # no answer from (a): the pipeline run is then the pair's first measurement
print("threadlocal-flag,non-lazy-backward" if failed else "threadlocal-flag,single-thread-autograd")
EOF
)
echo "winner=$WINNER (from repro-sta-shim)" >>"$RUNS/runs.txt"

# (b) the winner on the seeds preset, and the pair it is compared with
PIPE=(pipeline --device "$DEVICE" "${SEEDS[@]}" --steps 20 --stall-timeout 30)
run_case seeds-winner 60 "${PIPE[@]}" --mitigation "$WINNER"
publish
if [ "$WINNER" != "threadlocal-flag,non-lazy-backward" ]; then
  run_case seeds-nonlazy 55 "${PIPE[@]}" --mitigation threadlocal-flag,non-lazy-backward
  publish
fi

# (c) a thread looping symbolic_trace beside the workers, without and with isolate-fx-patches
run_case trace-none 100 "${PIPE[@]}" --tracing-thread --mitigation "$WINNER"
publish
run_case trace-isolated 60 "${PIPE[@]}" --tracing-thread --mitigation "$WINNER,isolate-fx-patches"
echo "script wall $((SECONDS - START))s" >>"$RUNS/runs.txt"
publish
cat "$OUT/table.md" "$OUT/runs.txt"
rm -rf "$RUNS"
