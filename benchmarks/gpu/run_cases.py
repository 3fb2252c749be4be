"""Run named commands side by side, each with its own cold inductor/triton cache and a hard time cap.

    python benchmarks/gpu/run_cases.py CASES.txt OUT_DIR [--parallel N]

CASES.txt holds one case per line: `name|cap seconds|command` (blank lines and `#` comments skipped); the command
runs with OUT_CASE set to OUT_DIR/name.json (where it should write its JSON) and its stdout+stderr go to
OUT_DIR/name.log. OUT_DIR/cases.json lists every case's exit code and wall time. A case killed at its cap gets
exit code 124. Used by the H200 scripts so several cold-cache runs fit in one device call.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def read_cases(path: Path):
    cases = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, cap, command = line.split("|", 2)
        cases.append((name.strip(), float(cap), command.strip()))
    return cases


def start(name: str, command: str, out_dir: Path):
    cache = Path(tempfile.mkdtemp(prefix=f"cache-{name}-"))
    env = dict(os.environ, OUT_CASE=str(out_dir / f"{name}.json"), PYTHONUNBUFFERED="1",
               TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton"))
    log = open(out_dir / f"{name}.log", "wb")
    popen = subprocess.Popen(["bash", "-c", command], stdout=log, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
    return popen, log, time.perf_counter()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cases = read_cases(Path(argv[0]))
    out_dir = Path(argv[1])
    parallel = int(argv[argv.index("--parallel") + 1]) if "--parallel" in argv else 1
    out_dir.mkdir(parents=True, exist_ok=True)
    pending, running, done = list(cases), [], []
    began = time.perf_counter()
    while pending or running:
        while pending and len(running) < parallel:
            name, cap, command = pending.pop(0)
            running.append((name, cap, command, *start(name, command, out_dir)))
            print(f"[{time.perf_counter() - began:6.1f}s] start {name}: {command}", flush=True)
        time.sleep(0.5)
        for entry in list(running):
            name, cap, command, popen, log, t0 = entry
            rc = popen.poll()
            if rc is None and time.perf_counter() - t0 > cap:
                os.killpg(popen.pid, signal.SIGKILL)
                popen.wait()
                rc = 124
            if rc is not None:
                log.close()
                running.remove(entry)
                wall = round(time.perf_counter() - t0, 2)
                done.append({"name": name, "rc": rc, "wall_s": wall, "command": command})
                print(f"[{time.perf_counter() - began:6.1f}s] done  {name}: rc={rc} wall={wall}s", flush=True)
    (out_dir / "cases.json").write_text(json.dumps(done, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
