"""Bookkeeping for benchmarks/gpu/round_2026_12_06.sh: one step's meta, then every step folded into one JSON per
block, so what comes back from the device stays a handful of files.

    python benchmarks/gpu/round_bundle.py meta WORK NAME RC T0 LIMIT COMMAND
    python benchmarks/gpu/round_bundle.py bundle WORK OUT

A block's file (`issue35_B.json`, ...) maps each step name to {meta, doc}: the exit code, seconds, whether the
timeout ended it, the tails of its stdout and stderr, and the tool's own JSON document (or null when it wrote
none). Bulky lists the tables never read (per-event timelines, stack samples) are cut to their first entries.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

BLOCKS = {"A": "issue34_A.json", "B": "issue35_B.json", "C": "issue37_C.json", "H": "heldout_H.json",
          "G": "issue34_G.json", "T": "issue37_T.json",
          "D": "issue35_D.json", "P": "issue36_P.json", "S": "issue41_S.json", "Q": "issue41_Q.json"}
BULKY = ("events", "samples", "stacks", "frames")
KEEP_ITEMS = 5
TEXT_CAP = 4000


def _tail(path: Path, cap: int) -> str:
    try:
        return path.read_bytes()[-cap:].decode("utf-8", "replace")
    except OSError:
        return ""


def write_meta(work: Path, name: str, rc: str, t0: str, limit: str, command: str) -> None:
    meta = {"step": name, "rc": int(rc), "seconds": round(time.time() - float(t0), 1), "limit_s": int(limit),
            "timed_out": int(rc) in (124, 137), "command": command,
            "stdout_tail": _tail(work / f"{name}.stdout", 1500), "stderr_tail": _tail(work / f"{name}.stderr", 3000)}
    (work / f"{name}.meta.json").write_text(json.dumps(meta), encoding="utf-8")


def _slim(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (_slim(v)[:KEEP_ITEMS] + ([f"... {len(v) - KEEP_ITEMS} more"] if len(v) > KEEP_ITEMS else [])
                    if k in BULKY and isinstance(v, list) else _slim(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_slim(v) for v in value]
    if isinstance(value, str) and len(value) > TEXT_CAP:
        return value[:TEXT_CAP // 2] + " ... " + value[-TEXT_CAP // 2:]
    return value


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def bundle(work: Path, out: Path) -> None:
    for letter, filename in BLOCKS.items():
        steps = {}
        for meta_path in sorted(work.glob(f"{letter}*.meta.json")):
            name = meta_path.name[:-len(".meta.json")]
            steps[name] = {"meta": _load(meta_path), "doc": _slim(_load(work / f"{name}.json"))}
        extra = {p.stem: _slim(_load(p)) for p in sorted(work.glob(f"{letter}*_loop.json"))}
        if steps or extra:
            (out / filename).write_text(json.dumps({"steps": steps, "loops": extra}, indent=1), encoding="utf-8")
    versions = {"py_spy": _tail(work / "py-spy-version.txt", 200).strip(),
                "py_spy_install": _tail(work / "py-spy-install.txt", 600).strip()}
    env_path = out / "env.json"
    env = _load(env_path) or {}
    env.update(versions)
    env_path.write_text(json.dumps(env), encoding="utf-8")


def main(argv: list) -> int:
    if argv[:1] == ["meta"] and len(argv) >= 7:
        write_meta(Path(argv[1]), argv[2], argv[3], argv[4], argv[5], " ".join(argv[6:]))
        return 0
    if argv[:1] == ["bundle"] and len(argv) == 3:
        bundle(Path(argv[1]), Path(argv[2]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
