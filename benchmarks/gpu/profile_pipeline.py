"""Where a reference pipeline step's time goes (issue: a profiled pipeline): run `pipeline` in this process, profile
steps FROM..TO with torch.profiler, and write what the GPU did in that window.

    PYTHONPATH=. python3 benchmarks/gpu/profile_pipeline.py --preset small --device cuda --out DIR

DIR gets `summary.json` (the tool's own pipeline facts: MFU, tokens/s, step-time percentiles; and, from the profile:
GPU busy share of the window, idle gaps, the top kernels, kernel launches and host syncs per step), `summary.md`
(the same as tables) and `trace.json.gz` (the Chrome trace, for Perfetto).

The profiler is started and stopped by one controller thread of its own, when the run's progress reports step
FROM and step TO done on every replica: the workers' threads are the run's, untouched. GPU activity (kernels,
copies) and CUDA runtime calls (launches, syncs) are recorded by CUPTI for every thread; CPU op events only for
the thread that started the profiler (its callbacks are thread-local), so `cpu_threads_seen` is 0 and the host side
is read from the runtime calls.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import threading
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dflash_doctor.reference.pipeline import PipelineOptions, run_pipeline  # noqa: E402
from dflash_doctor.reference.results import Progress  # noqa: E402

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cudaMemcpyAsync")
GAP_BUCKETS_US = (10, 100, 1000, 10000)


class StepWindow(Progress):
    """Counts completed steps; the controller waits on it."""

    def __init__(self) -> None:
        self.done = 0
        self.changed = threading.Condition()

    def step(self, done, total, loss, tokens_per_s) -> None:
        with self.changed:
            self.done = done
            self.changed.notify_all()

    def wait_for(self, step: int, finished: threading.Event) -> bool:
        with self.changed:
            while self.done < step and not finished.is_set():
                self.changed.wait(0.5)
            return self.done >= step


def control(window: StepWindow, first: int, last: int, finished: threading.Event, trace_path: Path,
            marks: dict) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    if not window.wait_for(first, finished):
        return
    prof = profile(activities=activities)
    prof.start()
    marks["first"] = window.done
    window.wait_for(last, finished)
    marks["last"] = window.done
    prof.stop()
    prof.export_chrome_trace(str(trace_path))


def union_us(intervals) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def summarise(trace: dict, steps: int) -> dict:
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    if not events:
        return {"error": "the profile holds no events"}
    begin = min(e["ts"] for e in events)
    end = max(e["ts"] + e["dur"] for e in events)
    window_us = end - begin
    intervals = sorted((e["ts"], e["ts"] + e["dur"]) for e in gpu)
    busy_us = union_us(intervals)
    gaps = [b[0] - a[1] for a, b in zip(intervals, intervals[1:]) if b[0] > a[1]]
    buckets = {f">{low}us": [round(sum(g for g in gaps if g > low) / 1000, 3), sum(1 for g in gaps if g > low)]
               for low in GAP_BUCKETS_US}
    by_kernel = defaultdict(lambda: [0, 0.0])
    for e in gpu:
        entry = by_kernel[e["name"][:120]]
        entry[0] += 1
        entry[1] += e["dur"]
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1][1])[:20]
    runtime = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("cat") == "cuda_runtime" or e.get("cat") == "cuda_driver":
            runtime[e["name"]][0] += 1
            runtime[e["name"]][1] += e["dur"]
    cpu_ops = defaultdict(lambda: [0, 0.0])
    threads = set()
    for e in events:
        if e.get("cat") == "cpu_op":
            cpu_ops[e["name"]][0] += 1
            cpu_ops[e["name"]][1] += e["dur"]
            threads.add(e.get("tid"))
    per_step = max(1, steps)
    return {
        "steps_profiled": steps,
        "window_ms": round(window_us / 1000, 3),
        "gpu_busy_ms": round(busy_us / 1000, 3),
        "gpu_busy_share": round(busy_us / window_us, 4) if window_us else None,
        "gpu_ms_per_step": round(busy_us / 1000 / per_step, 3),
        "wall_ms_per_step": round(window_us / 1000 / per_step, 3),
        "kernels_per_step": round(sum(1 for e in gpu if e.get("cat") == "kernel") / per_step, 1),
        "idle_gaps_ms_and_count": buckets,
        "top_gpu": [{"name": name, "count": count, "ms": round(us / 1000, 3),
                     "share_of_busy": round(us / busy_us, 4) if busy_us else None}
                    for name, (count, us) in top],
        "runtime_calls_per_step": {name: [round(count / per_step, 1), round(us / 1000 / per_step, 3)]
                                   for name, (count, us) in sorted(runtime.items(), key=lambda kv: -kv[1][1])[:12]},
        "host_syncs_per_step": {name: round(runtime[name][0] / per_step, 1) for name in SYNC_CALLS if name in runtime},
        "cpu_threads_seen": len(threads),
        "top_cpu_ops_ms_per_step": {name: round(us / 1000 / per_step, 3) for name, (count, us)
                                    in sorted(cpu_ops.items(), key=lambda kv: -kv[1][1])[:12]},
    }


def markdown(doc: dict) -> str:
    facts, prof = doc["pipeline"], doc["profile"]
    lines = [f"# profile: {doc['command']}", "",
             f"torch {doc['torch']}; MFU {facts.get('mfu')}; tokens/s {facts.get('tokens_per_s')}; "
             f"step time {facts.get('step_time_s')}", ""]
    if "error" in prof:
        return "\n".join(lines + [prof["error"], ""])
    lines += [f"steps {prof['steps_profiled']}: window {prof['window_ms']} ms, GPU busy {prof['gpu_busy_ms']} ms "
              f"({prof['gpu_busy_share']:.1%}), {prof['gpu_ms_per_step']} GPU ms / {prof['wall_ms_per_step']} wall ms "
              f"per step, {prof['kernels_per_step']} kernels per step", "",
              "| idle gaps | ms | count |", "|---|---|---|"]
    lines += [f"| {k} | {ms} | {n} |" for k, (ms, n) in prof["idle_gaps_ms_and_count"].items()]
    lines += ["", "| kernel | count | ms | share of busy |", "|---|---|---|---|"]
    lines += [f"| `{k['name']}` | {k['count']} | {k['ms']} | {k['share_of_busy']} |" for k in prof["top_gpu"]]
    lines += ["", "| runtime call | per step | ms per step |", "|---|---|---|"]
    lines += [f"| {name} | {n} | {ms} |" for name, (n, ms) in prof["runtime_calls_per_step"].items()]
    return "\n".join(lines + [""])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--workers", default="threads")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--from-step", type=int, default=15)
    parser.add_argument("--to-step", type=int, default=25)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--mitigation", default="none")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not 1 <= args.from_step < args.to_step <= args.steps:
        parser.error("need 1 <= --from-step < --to-step <= --steps")
    args.out.mkdir(parents=True, exist_ok=True)
    trace_path = args.out / "trace.json"
    window, finished, marks = StepWindow(), threading.Event(), {}
    controller = threading.Thread(target=control, name="profiler-control", daemon=True,
                                  args=(window, args.from_step, args.to_step, finished, trace_path, marks))
    controller.start()
    options = PipelineOptions(preset=args.preset, device=args.device, workers=args.workers, steps=args.steps,
                              batch_size=args.batch_size, mitigation=args.mitigation)
    try:
        result = run_pipeline(options, window)
    finally:
        finished.set()
        controller.join(120)
    import torch

    profile = {"error": "the run ended before the profiled window"}
    if trace_path.exists():
        trace = json.loads(trace_path.read_text())
        profile = summarise(trace, marks.get("last", 0) - marks.get("first", 0))
        with open(trace_path, "rb") as raw, gzip.open(args.out / "trace.json.gz", "wb") as packed:
            shutil.copyfileobj(raw, packed)
        os.remove(trace_path)
    doc = {"command": " ".join(sys.argv), "torch": torch.__version__, "window": marks,
           "pipeline": result.facts(), "profile": profile}
    (args.out / "summary.json").write_text(json.dumps(doc, indent=1, default=str))
    (args.out / "summary.md").write_text(markdown(doc))
    print(markdown(doc))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
