#!/usr/bin/env bash
# Issue 3 on the H200: `dflash-doctor guards` with probes, and each probe alone with a long deadline so a probe
# that times out inside the full run shows its own output.
set -u
OUT="${OUT:-$(mktemp -d)}"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="$OUT" bash benchmarks/gpu/guards_only.sh  # the full run (JSON) and the text view; starts summary.txt
for probe in cross_thread_leak stuck_flag is_compiling_leak; do
  began=$SECONDS
  timeout 90 python3 -m dflash_doctor.guards.probe_host --timeout 60 "$probe" >"$OUT/probe_$probe.json" 2>&1
  echo "probe $probe rc=$? wall=$((SECONDS - began))s" | tee -a "$OUT/summary.txt"
done
began=$SECONDS
timeout 90 python3 -m dflash_doctor.guards.probe_host --timeout 60 --isolation none is_compiling_leak \
  >"$OUT/probe_is_compiling_leak_nofork.json" 2>&1
echo "probe is_compiling_leak (no fork) rc=$? wall=$((SECONDS - began))s" | tee -a "$OUT/summary.txt"
