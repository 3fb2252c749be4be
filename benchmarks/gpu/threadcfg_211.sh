#!/usr/bin/env bash
# The rows that use non-lazy-backward, on torch 2.11 (one H100 or H200, cold cache), after the switch moved to
# runtime/thread_config.py (set in the calling thread and in every thread started later; docs/races.md "Compile
# settings are per thread from torch 2.12"). On 2.11 the storage is process-wide, so every row must read as it did
# before (docs/gpu-results.md): nothing may get worse. The lead runs it with the device tool:
#   run(command="bash benchmarks/gpu/threadcfg_211.sh", timeout_s=600)
# Steps (each bounded by `timeout`; every JSON lands in $OUT):
#   R1 repro, 3 threads, per-thread shapes, --mitigation non-lazy-backward        (was: the FX RuntimeError or
#      not reproduced; never a deadlock)
#   R2 repro, 3 threads, per-thread shapes, --mitigation threadlocal-flag,non-lazy-backward   (was: holds)
#   R3 repro, 3 threads, same shapes,       --mitigation threadlocal-flag,non-lazy-backward   (was: holds)
#   P  pipeline --preset small, 20 steps, --mitigation threadlocal-flag,non-lazy-backward     (was: trains)
#   G  guards: compile settings read as process-wide on 2.11 (facts.compile_settings), no DFD611
# About 6-8 minutes. STEPS="R1 R2" runs a subset. Each repro JSON's facts.multi_thread.threads[*].switches shows
# the switch as every worker read it (True expected).
set -u
OUT="${OUT:-$(mktemp -d)}"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DD="python3 -m dflash_doctor"
STEPS="${STEPS:-G R1 R2 R3 P}"
python3 -c 'import torch, sys; print("torch", torch.__version__, "python", sys.version.split()[0], torch.cuda.get_device_name())' | tee "$OUT/env.txt"
step() { echo "== $1 $(date +%T)" | tee -a "$OUT/steps.log"; }
repro_row() {  # name shapes mitigation
  step "$1 repro --threads 3 --shapes $2 --mitigation $3"
  timeout 200 $DD repro --threads 3 --shapes "$2" --device cuda --cache cold --mitigation "$3" \
    -f json -o "$OUT/$1_repro.json" >"$OUT/$1.stdout" 2>"$OUT/$1.stderr"; echo "$1 exit $?" | tee -a "$OUT/steps.log"
}
for s in $STEPS; do case "$s" in
G)  step "G guards"
    timeout 120 $DD guards -f json -o "$OUT/G_guards.json" >/dev/null 2>"$OUT/G.stderr"; echo "G exit $?" | tee -a "$OUT/steps.log" ;;
R1) repro_row R1 per-thread non-lazy-backward ;;
R2) repro_row R2 per-thread threadlocal-flag,non-lazy-backward ;;
R3) repro_row R3 same threadlocal-flag,non-lazy-backward ;;
P)  step "P pipeline small threadlocal-flag,non-lazy-backward"
    timeout 240 $DD pipeline --preset small --device cuda --steps 20 --mitigation threadlocal-flag,non-lazy-backward \
      -f json -o "$OUT/P_pipeline.json" >"$OUT/P.stdout" 2>"$OUT/P.stderr"; echo "P exit $?" | tee -a "$OUT/steps.log" ;;
esac; done
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for path in sorted(out.glob("*.json")):
    doc = json.loads(path.read_text())
    facts = doc.get("facts", {})
    codes = [f["code"] for f in doc.get("findings", [])]
    if "compile_settings" in facts:
        print(path.name, "compile settings:", facts["compile_settings"]["storage"], "findings:", codes)
    elif "multi_thread" in facts:
        threads = (facts.get("multi_thread") or {}).get("threads", [])
        print(path.name, "verdict:", facts.get("verdict"), facts.get("kind"), "wall_s:", facts.get("wall_s"),
              "switches:", [t.get("switches") for t in threads], "findings:", codes)
    else:
        workers = facts.get("workers", [])
        print(path.name, "steps:", facts.get("steps"), "switches:", [w.get("switches") for w in workers],
              "findings:", codes)
PY
