#!/usr/bin/env bash
# Issue 3 on the H200, the short form: one full `dflash-doctor guards` run (static part and the three probes),
# JSON report and text view. guards_h200.sh also runs each probe alone.
set -u
OUT="${OUT:-$(mktemp -d)}"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
began=$SECONDS
timeout 80 python3 -m dflash_doctor guards --format json --output "$OUT/guards.json" 2>"$OUT/guards.err"
echo "guards rc=$? wall=$((SECONDS - began))s" | tee "$OUT/summary.txt"
timeout 60 python3 -m dflash_doctor guards --no-probes >"$OUT/guards.txt" 2>&1
echo "guards --no-probes rc=$?" | tee -a "$OUT/summary.txt"
