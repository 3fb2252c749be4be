#!/usr/bin/env bash
# Quick GPU smoke of every command that touches CUDA: CLI start, guards, a natural repro, the pipeline's small
# preset (threads), live gpus. Each step is capped by `timeout`; outputs land in "$OUT". About 5 minutes.
set -u
OUT="${OUT:-$(mktemp -d)}"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
LOG="$OUT/smoke.log"
step() { echo "=== $1" | tee -a "$LOG"; shift; ( "$@" ) >>"$LOG" 2>&1; echo "rc=$?" | tee -a "$LOG"; }
step versions python3 -c "import torch, triton, typer, sys; print(sys.version, torch.__version__, triton.__version__, typer.__version__, torch.cuda.get_device_name(0))"
step help timeout 30 python3 -m dflash_doctor --help
step guards timeout 60 python3 -m dflash_doctor guards --format json --output "$OUT/guards.json"
step gpus timeout 30 python3 -m dflash_doctor gpus --samples 3 --interval 0.2 --format json --output "$OUT/gpus.json"
step pipeline-small timeout 150 python3 -m dflash_doctor pipeline --preset small --device cuda --steps 20 --format json --output "$OUT/pipeline_small.json"
step repro-natural timeout 200 python3 -m dflash_doctor repro --threads 3 --device cuda --steps 3 --hang-after 20 --timeout 90 --format json --output "$OUT/repro_natural.json"
tail -c 6000 "$LOG"
