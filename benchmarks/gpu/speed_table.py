"""The speed issue's table from one speed_h200.sh call: every figure read from the tool's own JSON in OUT (and the
wall seconds the script logged per part), each against its target.

    python3 benchmarks/gpu/speed_table.py OUT
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple


def _facts(out: Path, name: str) -> Optional[dict]:
    path = out / f"{name}.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())["facts"]
    except (ValueError, KeyError):
        return None


def _walls(out: Path) -> Dict[str, Tuple[int, float]]:
    walls = {}
    log = out / "steps.log"
    for line in (log.read_text().splitlines() if log.exists() else []):
        found = re.match(r"(\S+) exit (\d+) wall ([\d.]+) s", line)
        if found:
            walls[found.group(1)] = (int(found.group(2)), float(found.group(3)))
    return walls


def _pipeline(facts: Optional[dict]) -> str:
    if not facts:
        return "not run"
    steps = facts.get("step_time_s") or {}
    mfu = facts.get("mfu")
    return (f"MFU {mfu * 100:.1f} %, {facts.get('tokens_per_s') or 0:,.0f} tok/s, step p50 {steps.get('p50')} s "
            f"p90 {steps.get('p90')} s, warm-up {facts.get('warmup_s')} s" if mfu is not None else "no MFU")


def _verdict(facts: Optional[dict]) -> str:
    if not facts:
        return "not run"
    level = facts.get("level") or "-"
    return (f"{facts.get('verdict')} ({facts.get('kind') or '-'}, {level}), first verdict "
            f"{facts.get('time_to_verdict_s')} s, all trials {facts.get('wall_s')} s")


def _anchors(out: Path) -> Optional[dict]:
    path = out / "A_anchors.json"
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except ValueError:
        return None


def _cpu_words(facts: Optional[dict]) -> str:
    """The matrix's CPU with every core busy (facts.cpu) and how its children started (facts.warm_start)."""
    cpu = (facts or {}).get("cpu")
    if not cpu:
        return ""
    warm = (facts or {}).get("warm_start") or {}
    return (f"; CPU {cpu['children_s']} s in {cpu['children']} children over {cpu['cores']} cores: all busy "
            f"{cpu['bound_s']} s, the run {facts['wall_s'] / max(cpu['bound_s'], 0.1):.2f}x that; children forked "
            f"{warm.get('forked')}, fresh {warm.get('fresh')}")


def rows(out: Path) -> List[Tuple[str, str, str, str]]:
    walls = _walls(out)
    wall = lambda name: f"{walls[name][1]:.1f} s wall (exit {walls[name][0]})" if name in walls else "not run"  # noqa: E731
    small, eager = _facts(out, "P_small"), _facts(out, "E_small_eager")

    def met(value: Optional[float], target: float) -> str:
        return "-" if value is None else ("met" if value <= target else "MISSED")

    def mfu_met(facts: Optional[dict]) -> str:
        return "-" if not facts or facts.get("mfu") is None else ("met" if facts["mfu"] >= 0.35 else "MISSED")

    verdict_s: Callable[[Optional[dict]], Optional[float]] = lambda f: f.get("time_to_verdict_s") if f else None  # noqa: E731
    matrix = _facts(out, "X_matrix")
    guards = _facts(out, "G_guards")
    guards_s = (guards.get("seconds") or {}).get("total") if guards else None
    table = [
        ("pipeline --preset small --device cuda (defaults)", _pipeline(small), "MFU 35 %", mfu_met(small)),
        ("... --no-compile-dense (as before the change)", _pipeline(eager), "(the A/B)", "-"),
        ("... --batch-size 32", _pipeline(_facts(out, "B_small_batch32")), "(not the default)", "-"),
        ("repro --threads 3 --device cuda", _verdict(_facts(out, "R_default")), "20 s to the first verdict",
         met(verdict_s(_facts(out, "R_default")), 20.0)),
        ("repro --threads 3 --shapes per-thread --matrix", f"{matrix.get('wall_s')} s (facts.wall_s); "
         + wall("X_matrix") + _cpu_words(matrix) if matrix else wall("X_matrix"), "180 s",
         met(matrix.get("wall_s") if matrix else None, 180.0)),
    ]
    for model in ("mlp", "attention"):
        facts = _facts(out, f"M_{model}")
        table.append((f"repro --model benchmarks.gpu.user_models:{model}", _verdict(facts), "45 s to a verdict",
                      met(verdict_s(facts), 45.0)))
    table.append(("guards", f"{guards_s} s (facts.seconds.total; torch's import in the probe host "
                  f"{(guards.get('seconds') or {}).get('probe_import')} s)" if guards else "not run", "8 s",
                  met(guards_s, 8.0)))
    anchors = _anchors(out)
    if anchors:
        first, second = anchors["first"], anchors["second"]
        table.append(("anchors (benchmarks/gpu/anchors.py)",
                      f"import torch {first['import_torch_s']} s (again: {second['import_torch_s']} s), "
                      f"torch._dynamo {second['import_dynamo_s']} s more, torch.compile(fn) made "
                      f"{second['compile_wrapper_s']} s (CUDA initialised by it: torch "
                      f"{second['torch_cuda_initialised']}, driver {second['driver_initialised']}; threads "
                      f"{second['threads']})", "-", "-"))
    return table


def main(argv: List[str]) -> int:
    out = Path(argv[1])
    env = (out / "env.txt").read_text().splitlines()[0] if (out / "env.txt").exists() else "?"
    print(f"{env}\n")
    print("| what | measured | target | |\n|---|---|---|---|")
    for what, measured, target, verdict in rows(out):
        print(f"| `{what}` | {measured} | {target} | {verdict} |")
    profile = out / "F_profile" / "summary.md"
    if profile.exists():
        print("\n" + "\n".join(profile.read_text().splitlines()[:30]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
