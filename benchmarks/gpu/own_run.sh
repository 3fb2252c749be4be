#!/usr/bin/env bash
# `dflash-doctor run` and `attach` on the user's own code, unmodified, on one H200 (issue 23; docs/races.md "The
# plain loop"). The lead runs it with the device tool, carrying the py-spy wheel (git-ignored .whl/):
#   run(command="bash benchmarks/gpu/own_run.sh", carry=[".whl"], timeout_s=600)
# Steps (each bounded by `timeout`; every JSON lands in $OUT, the table in $OUT/own_run.md):
#   A  the plain loop, same shapes, cold cache, under `run --on-hang kill`: DFD902 expected, latency from the
#      tool's JSON (last stack sample without the cycle -> the finding; target <= 15 s)
#   B  the same loop under `run --fix threadlocal-flag,non-lazy-backward --cache cold`, different and same shapes:
#      expected to complete with no finding (exit 0 under --expect clean)
#   C  the loop started outside `run` (fresh cache), `attach PID` every few seconds until it names the cycle
#   D  benchmarks/gpu/seeds_like_trainer.py (target + 3 drafter threads, module-level compiled flex_attention,
#      no dflash_doctor import) under `run --cache cold --on-hang kill`: the FX error with its holder, the
#      deadlock, or a clean run, as the tool reports it
#   E  the bootstrap's overhead per step of the reference pipeline, small preset, on the GPU
#   F  the loop outside `run` once deadlocked: `attach` six more times; every attach must name the same cycle
#      (issue 37: one H100 attach once said DFD903 between the two drafters, later ones DFD902); F_labels.txt
# About 4-6 minutes. STEPS="A B" runs a subset; the lead may add steps after E.
set -u
OUT="${OUT:-$(mktemp -d)}"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DD="python3 -m dflash_doctor"
STEPS="${STEPS:-A B C D E F}"
python3 -c 'import torch, sys; print("torch", torch.__version__, "python", sys.version.split()[0], torch.cuda.get_device_name())' | tee "$OUT/env.txt"
if ! command -v py-spy >/dev/null; then
  pip install --no-index --quiet .whl/py_spy*.whl >"$OUT/py-spy-install.txt" 2>&1 || echo "py-spy wheel not installed (step C will say so)" | tee -a "$OUT/env.txt"
fi
py-spy --version >>"$OUT/env.txt" 2>&1
step() { echo "== $1 $(date +%T)" | tee -a "$OUT/steps.log"; }
fresh_cache() { export TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)"; export TRITON_CACHE_DIR="$TORCHINDUCTOR_CACHE_DIR/triton"; }

for s in $STEPS; do case "$s" in
A)
  step "A plain loop, same shapes, run --cache cold --on-hang kill"
  timeout 150 $DD run --cache cold --on-hang kill --hang-after 90 -f json -o "$OUT/A_run.json" -- \
    python3 benchmarks/gpu/plain_loop.py --shapes same --hang-after 120 --out "$OUT/A_loop.json" \
    >"$OUT/A.stdout" 2>"$OUT/A.stderr"; echo "A exit $?" | tee -a "$OUT/steps.log" ;;
B)
  for shapes in different same; do
    step "B plain loop, $shapes shapes, run --fix threadlocal-flag,non-lazy-backward --cache cold"
    timeout 120 $DD run --fix threadlocal-flag,non-lazy-backward --cache cold --expect clean --on-hang kill \
      --hang-after 60 -f json -o "$OUT/B_${shapes}_run.json" -- \
      python3 benchmarks/gpu/plain_loop.py --shapes "$shapes" --hang-after 60 --out "$OUT/B_${shapes}_loop.json" \
      >"$OUT/B_$shapes.stdout" 2>"$OUT/B_$shapes.stderr"; echo "B $shapes exit $?" | tee -a "$OUT/steps.log"
  done ;;
C)
  step "C plain loop outside run, attach until it names the cycle"
  ( fresh_cache; exec python3 benchmarks/gpu/plain_loop.py --shapes same --hang-after 300 --out "$OUT/C_loop.json" ) \
    >"$OUT/C_loop.stdout" 2>"$OUT/C_loop.stderr" &
  LOOP=$!; started=$(date +%s)
  for _ in $(seq 1 12); do
    sleep 5
    timeout 60 $DD attach "$LOOP" --samples 2 --interval 2 -f json -o "$OUT/C_attach.json" 2>>"$OUT/C_attach.stderr"
    rc=$?; echo "C attach exit $rc after $(( $(date +%s) - started )) s" | tee -a "$OUT/steps.log"
    [ "$rc" -eq 1 ] && break  # 1: findings (the cycle named); 4: not settled yet, attach again
  done
  kill -9 "$LOOP" 2>/dev/null; wait "$LOOP" 2>/dev/null ;;
D)
  step "D seeds-like trainer under run --cache cold --on-hang kill"
  timeout 200 $DD run --cache cold --on-hang kill --hang-after 90 -f json -o "$OUT/D_run.json" --trace "$OUT/D_trace.json" -- \
    python3 benchmarks/gpu/seeds_like_trainer.py --steps 20 --hang-after 150 \
    >"$OUT/D.stdout" 2>"$OUT/D.stderr"; echo "D exit $?" | tee -a "$OUT/steps.log" ;;
E)
  step "E bootstrap overhead, reference pipeline small preset, cuda"
  timeout 170 python3 benchmarks/run_overhead.py --device cuda --preset small --pairs 2 --rounds 5 --steps 20 \
    --out "$OUT/E_overhead.md" >"$OUT/E.stdout" 2>"$OUT/E.stderr"; echo "E exit $?" | tee -a "$OUT/steps.log" ;;
F)
  step "F plain loop outside run: once deadlocked, six more attaches name the same cycle"
  ( fresh_cache; exec python3 benchmarks/gpu/plain_loop.py --shapes same --hang-after 300 --out "$OUT/F_loop.json" ) \
    >"$OUT/F_loop.stdout" 2>"$OUT/F_loop.stderr" &
  LOOP=$!
  for _ in $(seq 1 14); do
    sleep 5
    timeout 60 $DD attach "$LOOP" --samples 2 --interval 1 -f json -o "$OUT/F_attach_0.json" 2>>"$OUT/F_attach.stderr"
    [ $? -eq 1 ] && break
  done
  for i in 1 2 3 4 5 6; do
    timeout 60 $DD attach "$LOOP" --samples 2 --interval 1 -f json -o "$OUT/F_attach_$i.json" 2>>"$OUT/F_attach.stderr"
    echo "F attach $i exit $?" | tee -a "$OUT/steps.log"
  done
  kill -9 "$LOOP" 2>/dev/null; wait "$LOOP" 2>/dev/null
  python3 -c 'import glob, json, sys
for path in sorted(glob.glob(sys.argv[1] + "/F_attach_*.json")):
    doc = json.load(open(path))
    print(path.rsplit("/", 1)[-1], [(f["code"], f["evidence"].get("cycle"), sorted(f["evidence"].get("threads", []))) for f in doc["findings"]])' \
    "$OUT" | tee "$OUT/F_labels.txt" ;;
esac; done
python3 benchmarks/gpu/own_run_table.py "$OUT" | tee "$OUT/own_run.md"
