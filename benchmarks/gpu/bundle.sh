#!/usr/bin/env bash
# Run several GPU evidence scripts in one device call and bring all their outputs back as one archive
# (the device tool returns at most 8 files). Usage: bash benchmarks/gpu/bundle.sh SCRIPT [SCRIPT...]
# Each SCRIPT runs with OUT=<scratch>/<script name>; "$OUT/gpu-evidence.tgz" holds every folder.
set -u
FINAL="${OUT:-$(mktemp -d)}"
SCRATCH="$(mktemp -d)"
for script in "$@"; do
  name="$(basename "$script" .sh)"
  mkdir -p "$SCRATCH/$name"
  echo "##### $name"
  began=$SECONDS
  OUT="$SCRATCH/$name" bash "$script"
  echo "##### $name rc=$? wall=$((SECONDS - began))s"
  # after every script, so a command cut off by the device's time limit still brings back what finished
  tar czf "$FINAL/gpu-evidence.tgz" -C "$SCRATCH" .
done
