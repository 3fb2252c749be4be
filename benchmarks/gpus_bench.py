"""GPU sampling overhead: NVML in-process (raw calls, and dflash-doctor's guarded sampler) vs spawning nvidia-smi.

    python benchmarks/gpus_bench.py [--rounds 200] [--json FILE]

Runs on a machine with an NVIDIA driver (the lead runs it on the H200 via benchmarks/gpu/nvml_live.sh). Without
NVML or without nvidia-smi it prints one line saying what is missing and exits 0, so it can sit in any run.
Rows are per sample round over every GPU; the anchor is one `nvidia-smi --query-gpu=index,memory.used,
utilization.gpu --format=csv,noheader` process (on an H200 with driver 580 that process took about 24 ms, and the two
raw NVML reads about 0.03 ms: an in-process sampler costs nothing next to the tool it replaces).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SMI = ["nvidia-smi", "--query-gpu=index,memory.used,utilization.gpu", "--format=csv,noheader"]


def timed(fn, rounds: int) -> float:
    """Median milliseconds of `rounds` calls."""
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = parser.parse_args()

    from dflash_doctor.gpus.nvml import NvmlUnavailable, PynvmlDevices

    try:
        devices = PynvmlDevices.open()
        count = devices.device_count()
        if count == 0:
            raise NvmlUnavailable("NVML sees no GPU")
    except NvmlUnavailable as exc:
        sys.stdout.write(f"gpus_bench: skipped: {exc}\n")
        return 0
    import pynvml

    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def raw_reads():
        for handle in handles:
            pynvml.nvmlDeviceGetMemoryInfo(handle)
            pynvml.nvmlDeviceGetUtilizationRates(handle)

    def guarded_sample():
        for index in range(count):
            devices.sample(index)

    rows = {
        "nvml raw: memory + utilization": timed(raw_reads, args.rounds),
        "dflash-doctor sampler (+ name, processes, guarded)": timed(guarded_sample, args.rounds),
    }
    if shutil.which("nvidia-smi"):
        rows["spawn nvidia-smi --query-gpu (anchor)"] = timed(
            lambda: subprocess.run(SMI, capture_output=True, check=True), max(5, args.rounds // 20))
    devices.shutdown()
    cli = [sys.executable, "-m", "dflash_doctor", "gpus", "--samples", "1", "--interval", "0", "--format", "json",
           "--fail-on", "never"]
    start = time.perf_counter()
    proc = subprocess.run(cli, capture_output=True, text=True, cwd=REPO)
    rows["dflash-doctor gpus --samples 1 (whole CLI, once)"] = (time.perf_counter() - start) * 1e3

    anchor = rows.get("spawn nvidia-smi --query-gpu (anchor)")
    out = [f"GPUs: {count}", "", "| per sample round | ms | x nvidia-smi |", "|---|---|---|"]
    for name, ms in rows.items():
        ratio = f"{ms / anchor:.4f}" if anchor else "-"
        out.append(f"| {name} | {ms:.3f} | {ratio} |")
    sys.stdout.write("\n".join(out) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"gpus": count, "rows_ms": rows, "cli_rc": proc.returncode,
                                               "cli_stderr": proc.stderr[-2000:]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
