#!/usr/bin/env bash
# One H200 call for two issues (the lead runs it with the device tool, timeout about 330 s):
#   run(command="bash benchmarks/gpu/patcher_and_profile.sh", timeout_s=330)
#   P1  the FX patcher race in the pipeline: `pipeline --preset seeds --tracing-thread` (a thread tracing a 32-block
#       module, reference/tracing.py) without the patcher fix (threadlocal-flag,single-thread-autograd) and with
#       it (+ isolate-fx-patches), side by side, each with a fresh compile cache
#   Q   where a step of the small preset goes: benchmarks/gpu/profile_pipeline.py (torch.profiler, steps 15..25)
#   P2  P1 again on the caches P1 left (a second trial of each)
# Everything lands in $OUT/gpu-evidence.tgz, re-packed after each part so a cut-off call still brings back what
# finished. DEVICE=cpu PRESET=tiny PROFILE_PRESET=tiny runs the same on a machine with no GPU (a dry run).
# PARTS="P1" runs a subset (default: P1 Q P2).
set -u
OUT="${OUT:-$(mktemp -d)}"; mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DD="python3 -m dflash_doctor"
DEVICE="${DEVICE:-cuda}"; PRESET="${PRESET:-seeds}"; PROFILE_PRESET="${PROFILE_PRESET:-small}"
R="$(mktemp -d)"
pack() { tar czf "$OUT/gpu-evidence.tgz" -C "$R" .; }
python3 -c 'import torch, sys; print("torch", torch.__version__, "python", sys.version.split()[0], torch.cuda.get_device_name() if torch.cuda.is_available() else "no cuda")' | tee "$R/env.txt"
step() { echo "== $1 $(date +%T)" | tee -a "$R/steps.log"; }
CACHE_WITHOUT="$(mktemp -d)"; CACHE_WITH="$(mktemp -d)"
pair() {  # $1: trial number, $2: cap in seconds
  for side in without with; do
    mitigation="threadlocal-flag,single-thread-autograd"; cache="$CACHE_WITHOUT"
    if [ "$side" = with ]; then mitigation="$mitigation,isolate-fx-patches"; cache="$CACHE_WITH"; fi
    TORCHINDUCTOR_CACHE_DIR="$cache" TRITON_CACHE_DIR="$cache/triton" timeout "$2" $DD pipeline --device "$DEVICE" \
      --preset "$PRESET" --steps 40 --stall-timeout 60 --tracing-thread --mitigation "$mitigation" \
      -f json -o "$R/P_${side}_$1.json" >"$R/P_${side}_$1.stdout" 2>"$R/P_${side}_$1.log" &
  done
  wait
  for side in without with; do
    python3 - "$R/P_${side}_$1.json" <<'PY' | tee -a "$R/steps.log"
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    print(sys.argv[1], "no report:", exc); sys.exit()
facts = doc["facts"]
tracer = [w for w in facts["workers"] if w["role"] == "tracer"]
dead = [(w["name"], (w["error"] or "")[:90]) for w in facts["workers"] if w["outcome"] != "ok"]
print(sys.argv[1].rsplit("/", 1)[-1], "exit", doc["exit_code"], "findings", [f["code"] for f in doc["findings"]],
      "steps", facts["steps"], "traces", tracer[0]["steps"] if tracer else None,
      tracer[0]["phase"] if tracer else "", "dead", dead)
PY
  done
}
PARTS="${PARTS:-P1 Q P2}"
for part in $PARTS; do case "$part" in
P1) step "P1 seeds --tracing-thread, without and with isolate-fx-patches, cold caches"; pair 1 150; pack ;;
Q)
  step "Q profile $PROFILE_PRESET"
  timeout 150 python3 benchmarks/gpu/profile_pipeline.py --preset "$PROFILE_PRESET" --device "$DEVICE" --steps 30 \
    --from-step 15 --to-step 25 --out "$R/Q_profile" >"$R/Q.stdout" 2>"$R/Q.log"; echo "Q exit $?" | tee -a "$R/steps.log"
  pack ;;
P2) step "P2 again, warm caches"; pair 2 90; pack ;;
esac; done
step done
