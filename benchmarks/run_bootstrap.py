"""CPU the `run` bootstrap adds to each Python interpreter the command starts (target: <= 20 ms for an interpreter
that imports nothing of torch; issue 41).

    python benchmarks/run_bootstrap.py [--interpreters 40] [--rounds 5] [--out benchmarks/results/run_bootstrap.md]

Each round starts `--interpreters` short interpreters bare and the same number with the bootstrap in their
environment exactly as `run` gives it (a real session folder), alternately, and reads the CPU they used from
getrusage(RUSAGE_CHILDREN). Two programs: `pass` (the target's case: the agent never starts) and one that starts a
thread (the agent starts: its imports and its watchdog). Prints, per program, the median CPU per interpreter bare
and under the bootstrap, the ratio and the milliseconds added; plus the modules each one has loaded.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = {
    "pass": "pass",
    "one thread": "import threading; t = threading.Thread(target=lambda: None); t.start(); t.join()",
}
TARGET_MS = 20.0


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _batch(code: str, env: Dict[str, str], count: int) -> float:
    """CPU seconds per interpreter over `count` interpreters run one after another."""
    before = _children_cpu()
    for _ in range(count):
        subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd="/")
    return (_children_cpu() - before) / count


def _modules(code: str, env: Dict[str, str]) -> int:
    shown = code + "; import sys; print(len(sys.modules))"
    return int(subprocess.run([sys.executable, "-c", shown], env=env, check=True, capture_output=True, text=True,
                              cwd="/").stdout.split()[-1])


def measure(interpreters: int, rounds: int) -> List[dict]:
    sys.path.insert(0, str(REPO))
    from dflash_doctor.supervise.session import RunConfig, Session, child_environment

    bare = dict(os.environ)
    bare.pop("PYTHONPATH", None)
    session = Session.create(RunConfig())
    try:
        under = child_environment(session.path, bare, token=session.token)
        rows = []
        for name, code in PROGRAMS.items():
            plain_s, boot_s = [], []
            for _ in range(rounds):
                plain_s.append(_batch(code, bare, interpreters))
                boot_s.append(_batch(code, under, interpreters))
            plain, boot = statistics.median(plain_s), statistics.median(boot_s)
            rows.append({"program": name, "bare_ms": round(plain * 1e3, 2), "bootstrap_ms": round(boot * 1e3, 2),
                         "ratio": round(boot / plain, 3), "added_ms": round((boot - plain) * 1e3, 2),
                         "modules_bare": _modules(code, bare), "modules_bootstrap": _modules(code, under)})
        return rows
    finally:
        session.close(remove=True)


def table(rows: List[dict]) -> str:
    lines = ["| program | CPU bare (ms) | CPU under run (ms) | ratio | added (ms) | modules bare / under run |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['program']} | {row['bare_ms']} | {row['bootstrap_ms']} | {row['ratio']} | "
                     f"{row['added_ms']} | {row['modules_bare']} / {row['modules_bootstrap']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interpreters", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = measure(args.interpreters, args.rounds)
    print(json.dumps(rows))
    print(table(rows), end="")
    added = rows[0]["added_ms"]
    print(f"pass: {added} ms added per interpreter (target <= {TARGET_MS} ms): "
          f"{'met' if added <= TARGET_MS else 'NOT met'}")
    if args.out:
        args.out.write_text(table(rows))


if __name__ == "__main__":
    main()
