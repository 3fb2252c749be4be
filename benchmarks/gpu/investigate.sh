#!/usr/bin/env bash
# Run a cases file (benchmarks/gpu/cases/NAME.txt) on the device, N at a time, and bring back one archive with every
# case's JSON and log plus a one-line summary per case. Usage: bash benchmarks/gpu/investigate.sh NAME [N]
set -u
OUT="${OUT:-$(mktemp -d)}"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
name="$1"; parallel="${2:-6}"
python3 -c 'import torch, triton, sys; print("torch", torch.__version__, "triton", triton.__version__, "python", sys.version.split()[0], torch.cuda.get_device_name())' | tee "$OUT/env.txt"
nvidia-smi --query-gpu=driver_version --format=csv,noheader >>"$OUT/env.txt" 2>&1
python3 benchmarks/gpu/run_cases.py "benchmarks/gpu/cases/$name.txt" "$OUT/$name" --parallel "$parallel"
python3 benchmarks/gpu/summarize_cases.py "$OUT/$name" | tee "$OUT/$name-summary.txt"
tar czf "$OUT/$name.tgz" -C "$OUT" "$name"
