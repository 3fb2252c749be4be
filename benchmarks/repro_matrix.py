"""`dflash-doctor repro --matrix --device cpu` as a user types it, against the anchors of the same run (one cold
inductor compile in a fresh process, `import torch`): the speed issue's CPU row (target 90 s on a quiet 2-core box).

    python benchmarks/repro_matrix.py                 # prints the table
    python benchmarks/repro_matrix.py --write         # ... and writes benchmarks/results/repro_matrix_cpu/latest.md
    python benchmarks/repro_matrix.py --jobs 2        # trials side by side (default: the tool's own choice)

The matrix is one run (about 4 minutes here), so the anchors' medians are given beside it, not divided out of a
median of matrices; the row outcomes are printed too, so a faster run that answers differently shows as such.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import REPO, _child_env, _cli, _cold_compile_seconds, _import_torch_seconds, machine_description  # noqa: E402

RESULTS = HERE / "results" / "repro_matrix_cpu"
TARGET_S = 90.0


def _cpu_lines(facts: dict) -> List[str]:
    """The CPU the trials used (facts.cpu, the tool's own count) and that CPU with every core busy: a wall time
    near it means the run is bound by its compiles, not by waiting."""
    cpu = facts.get("cpu")
    if not cpu:
        return []
    return [f"| CPU of the control and the {cpu['children']} trials that ended (facts.cpu.children_s) | "
            f"{cpu['children_s']:.1f} | |",
            f"| ... over {cpu['cores']} cores: that CPU with every core busy throughout (facts.cpu.bound_s) | "
            f"{cpu['bound_s']:.1f} | wall = {facts['wall_s'] / max(cpu['bound_s'], 0.1):.2f}x it |"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=None, help="repro --jobs (default: the tool's own choice).")
    parser.add_argument("--anchor-repeats", type=int, default=3)
    parser.add_argument("--write", action="store_true", help=f"Write {RESULTS.relative_to(REPO)}/latest.md.")
    args = parser.parse_args(argv)

    import_s = statistics.median(_import_torch_seconds() for _ in range(args.anchor_repeats))
    compile_s = statistics.median(_cold_compile_seconds() for _ in range(args.anchor_repeats))
    repro_args = ["repro", "--matrix", "--device", "cpu"] + (["--jobs", str(args.jobs)] if args.jobs else [])
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "matrix.json"
        load = os.getloadavg()
        started = time.perf_counter()
        proc = subprocess.run(_cli(*repro_args, "-f", "json", "-o", str(report)), capture_output=True, text=True,
                              timeout=1800, env=_child_env(), cwd=str(REPO))
        wall_s = time.perf_counter() - started
        if proc.returncode not in (0, 1) or not report.exists():
            sys.stderr.write(f"repro exited {proc.returncode}: {proc.stderr.strip()[-600:]}\n")
            return 2
        document = json.loads(report.read_text())
    facts = document["facts"]
    lines: List[str] = [
        f"Command: `dflash-doctor {' '.join(repro_args)}` (load average at the start: "
        f"{', '.join(f'{x:.2f}' for x in load)}; the tool's jobs: {facts['jobs']})", "",
        "| what | seconds | ratio |", "|---|---|---|",
        f"| `import torch` in a fresh process (anchor, median of {args.anchor_repeats}) | {import_s:.2f} | 1 |",
        f"| one cold inductor compile in a fresh process (anchor, median of {args.anchor_repeats}) | {compile_s:.2f} | "
        f"{compile_s / import_s:.1f}x import |",
        f"| the matrix, process wall | {wall_s:.1f} | {wall_s / compile_s:.1f}x cold compile, "
        f"{wall_s / TARGET_S:.2f}x the {TARGET_S:.0f} s target |",
        f"| the matrix, facts.wall_s | {facts['wall_s']:.1f} | |",
        *_cpu_lines(facts), "",
        "| row | outcome | kind | trials' seconds (longest) | its trials' CPU seconds |", "|---|---|---|---|---|",
    ]
    lines += [f"| {row['mitigation']} | {row['outcome']} | {row.get('kind') or '-'} | {row['seconds']} | "
              f"{row.get('cpu_s', '-')} |" for row in facts["matrix"]]
    sys.stdout.write("\n".join(lines) + "\n")
    if args.write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        header = ["# `repro --matrix --device cpu`: `benchmarks/repro_matrix.py`", "",
                  f"Command: `python benchmarks/repro_matrix.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
                  ""] + machine_description() + [""]
        (RESULTS / "latest.md").write_text("\n".join(header + lines) + "\n", encoding="utf-8")
        (RESULTS / "latest.json").write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
