"""Render the tables of docs/gpu-results.md ("The FX patcher race in the pipeline", "Profile of the small preset")
from what benchmarks/gpu/patcher_and_profile.sh brought back: the tool's own JSON reports, never typed figures.

    python3 benchmarks/gpu/patcher_table.py benchmarks/gpu/results/2026-12-02-patcher-profile
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def pipeline_rows(folder: Path):
    yield ("| trial | mitigation | exit | findings | steps | traces (median ms a trace) | tok/s | MFU | workers lost "
           "(first error line) |")
    yield "|---|---|---|---|---|---|---|---|---|"
    for path in sorted(folder.glob("P_*.json"), key=lambda p: (p.stem[-1], p.stem)):
        doc = json.loads(path.read_text())
        facts = doc["facts"]
        tracer = next(w for w in facts["workers"] if w["role"] == "tracer")
        median = tracer["phase"].rpartition("(median ")[2].rstrip(")") if "(median" in tracer["phase"] else "-"
        lost = sorted({(w["error"] or "").splitlines()[0][:70] for w in facts["workers"] if w["error"]})
        dead = sum(1 for w in facts["workers"] if w["error"])
        mfu = f"{facts['mfu']:.1%}" if facts.get("ok") and facts.get("mfu") else "-"
        tok = f"{facts['tokens_per_s']:,.0f}" if facts.get("ok") and facts.get("tokens_per_s") else "-"
        yield (f"| {path.stem[-1]} | {facts['mitigation']} | {doc['exit_code']} | "
               f"{', '.join(f['code'] for f in doc['findings']) or 'none'} | {facts['steps']} | {tracer['steps']} "
               f"({median}) | {tok} | {mfu} | {dead}: {'; '.join(lost) or '-'} |")


def profile_rows(folder: Path):
    doc = json.loads((folder / "Q_profile" / "summary.json").read_text())
    prof, facts = doc["profile"], doc["pipeline"]
    step = facts["step_time_s"]
    yield "| figure | value |"
    yield "|---|---|"
    yield f"| MFU (tool's report, whole run) | {facts['mfu']:.1%} |"
    yield f"| tokens/s | {facts['tokens_per_s']:,.0f} |"
    yield f"| step time p50 / p90 / p99 | {step['p50'] * 1000:.1f} / {step['p90'] * 1000:.1f} / {step['p99'] * 1000:.1f} ms |"
    yield f"| profiled steps ({doc['window']['first']}..{doc['window']['last']}) | {prof['steps_profiled']} |"
    yield f"| GPU busy share of the window | {prof['gpu_busy_share']:.1%} |"
    yield f"| GPU ms / wall ms per step | {prof['gpu_ms_per_step']} / {prof['wall_ms_per_step']} |"
    yield f"| kernels per step | {prof['kernels_per_step']} |"
    gaps = prof["idle_gaps_ms_and_count"]
    yield f"| idle gaps > 100 us: ms, count | {gaps['>100us'][0]}, {gaps['>100us'][1]} |"
    yield f"| idle gaps > 1 ms: ms, count | {gaps['>1000us'][0]}, {gaps['>1000us'][1]} |"
    for name, (count, ms) in prof["runtime_calls_per_step"].items():
        if name in ("cudaLaunchKernel", "cudaStreamSynchronize", "cudaGraphLaunch"):
            yield f"| {name} per step: calls, host ms | {count}, {ms} |"
    yield ""
    yield "| top GPU work (10 steps) | launches | ms | share of busy |"
    yield "|---|---|---|---|"
    for kernel in prof["top_gpu"][:10]:
        yield f"| `{kernel['name'][:70]}` | {kernel['count']} | {kernel['ms']} | {kernel['share_of_busy']:.1%} |"


def main() -> int:
    folder = Path(sys.argv[1])
    print("\n".join(pipeline_rows(folder)))
    print()
    print("\n".join(profile_rows(folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
