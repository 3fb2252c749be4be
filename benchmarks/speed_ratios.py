"""Issue 41's answer-speed targets, each as a ratio to its floor measured in the same run, on this machine.

    python3 benchmarks/speed_ratios.py --device cpu                       # every row
    python3 benchmarks/speed_ratios.py --device cuda --json speed.json    # on a GPU machine, figures kept as JSON
    python3 benchmarks/speed_ratios.py --only guards,repro                # some rows (guards, repro, matrix)

Floors, each in a fresh interpreter:
- import: `import torch; import torch._dynamo`, the seconds inside the interpreter (as benchmarks/gpu/anchors.py
  measures them); the process's wall, which adds the start and the exit, is shown beside it. One import runs
  first, untimed, so neither the floor nor the rows pay the first read of torch's libraries from disk.
- cold compile: the step `repro --threads 3` replays (build_drafter_step with repro's default preset,
  checkpoint and backward for --device, shape index 0, as repro/steps.py builds it), with a fresh
  TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR: its first call (the compile) and the process's wall, imports
  included.

Rows (every command as a user types it, with fresh compile caches):
- `repro --threads 3`: facts.time_to_verdict_s <= 2x the cold compile's first call.
- `guards`: wall and facts.seconds.total <= 1.2x the import floor (median of --repeat interleaved runs).
- `repro --threads 3 --shapes per-thread --matrix`: wall <= 15x the cold compile's first call.
With --profile, the guards row also times the probe host's phases (import, warm-up compile, a probe, the GPU count)
in stand-ins, as many side by side as guards starts hosts on that build, and says whether the compile initialised
the CUDA driver.

Every child runs under a timeout; one that fails or overruns makes its row say why in one line, and the other rows
still run. Exit status: 0 when every measured target is met, 1 when one is missed or could not be measured, 2 for
bad options.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
ROWS = ("guards", "repro", "matrix")
# The seconds the imports take inside the interpreter (what benchmarks/gpu/anchors.py measured: the 7.3 s);
# the process's wall adds the interpreter's start and, after importing torch, about a second of teardown on the
# 2-core box, which guards' probe host skips (os._exit): the wall is kept for reading.
IMPORT_CODE = ("import time; began = time.perf_counter(); import torch; import torch._dynamo; "
               "print(round(time.perf_counter() - began, 3))")
# The floor's child: the same step repro's phase child builds for thread 0 (repro/steps.py build_thread_steps).
COMPILE_CODE = r"""
import json, sys, time
began = time.perf_counter()
import torch
import torch._dynamo
imported = time.perf_counter() - began
from dflash_doctor.reference.replay import build_drafter_step
from dflash_doctor.repro.spec import ReproSpec
spec = ReproSpec(devices=(sys.argv[1],), **({"preset": sys.argv[2]} if sys.argv[2] else {})).validate()
t = time.perf_counter()
step = build_drafter_step(preset=spec.preset, device=spec.devices[0], checkpoint=spec.checkpoint, shape_index=0,
                          backward=spec.effective_backward, seed=0)
built = time.perf_counter() - t
t = time.perf_counter(); step.run(); first = time.perf_counter() - t  # run() returns a float: the device synced
t = time.perf_counter(); step.run(); second = time.perf_counter() - t
print(json.dumps({"import_s": round(imported, 3), "build_s": round(built, 3), "first_call_s": round(first, 3),
                  "second_call_s": round(second, 4), "preset": spec.preset, "checkpoint": spec.checkpoint,
                  "backward": spec.effective_backward, "torch": torch.__version__,
                  "device_name": torch.cuda.get_device_name() if spec.devices[0].startswith("cuda") else None}))
"""
# --profile: the probe host's phases, timed in a stand-in that does what guards/probe_host.py does (with --isolation
# none, as on a CUDA or ROCm build: the probe runs in the host itself); the host imports the tool's modules before
# torch, the stand-in after, so that their seconds are not counted in torch's.
HOST_PHASES_CODE = r"""
import json, sys, time
from functools import partial
marks = [("start", time.perf_counter())]
import torch
marks.append(("import torch", time.perf_counter()))
import torch._dynamo
marks.append(("import torch._dynamo", time.perf_counter()))
from dflash_doctor.guards.probes import BY_NAME
from dflash_doctor.guards.state import gpu_count, read_config
from dflash_doctor.repro.warm_start import cuda_driver_initialised
read_config(torch)
marks.append(("the tool's modules, the config read", time.perf_counter()))
compiled = torch.compile(lambda x: x + 1, backend="eager")
compiled(torch.ones(2))
marks.append(("warm-up compile (backend eager)", time.perf_counter()))
driver_after_compile = cuda_driver_initialised()
BY_NAME[sys.argv[1]].run(torch, compiled, 60.0, lambda: None)
marks.append((f"probe {sys.argv[1]}", time.perf_counter()))
count = gpu_count(torch)
marks.append(("gpu_count", time.perf_counter()))
print(json.dumps({"phases": {name: round(t - marks[i][1], 3) for i, (name, t) in enumerate(marks[1:])},
                  "driver_initialised_by_compile": driver_after_compile, "gpu_count": count}))
"""
TARGETS = {"repro": 2.0, "guards": 1.2, "matrix": 15.0}


class ChildFailed(RuntimeError):
    """A measured child did not give its figure: the row says this one line instead."""


@dataclass
class Child:
    argv: List[str]
    wall_s: float
    returncode: int
    stdout: str
    stderr: str


@dataclass
class Row:
    what: str
    measured_s: Optional[float]
    floor: str
    floor_s: Optional[float]
    target: Optional[float]  # None: shown for reading, not a target
    note: str = ""
    error: Optional[str] = None  # why it was not measured (a child failed, overran or found no time left)

    @property
    def ratio(self) -> Optional[float]:
        if self.measured_s is None or not self.floor_s:
            return None
        return self.measured_s / self.floor_s

    @property
    def status(self) -> str:
        if self.error is not None:
            return "NOT MEASURED"
        if self.target is None:
            return "info"
        if self.ratio is None:
            return "NOT MEASURED (no floor)"
        return "met" if self.ratio <= self.target else "MISSED"


@dataclass
class Run:
    device: str
    preset: Optional[str]
    started_at: str
    machine: Dict[str, object]
    floors: Dict[str, object] = field(default_factory=dict)
    measured: Dict[str, object] = field(default_factory=dict)
    rows: List[Row] = field(default_factory=list)
    load: List[List[object]] = field(default_factory=list)  # [what, 1-min load average before it]


def _env(cache: Optional[Path]) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed tool has its .pyc files
    if cache is not None:  # a user's first run: nothing compiled before
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
        env["TRITON_CACHE_DIR"] = str(cache / "triton")
    return env


def run_child(argv: Sequence[str], timeout_s: float, ok_codes: Sequence[int] = (0,)) -> Child:
    """One child with fresh compile caches, bounded by `timeout_s`; ChildFailed (one line) if it overran or failed."""
    cache = Path(tempfile.mkdtemp(prefix="speed-ratios-cache-"))
    began = time.perf_counter()
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, errors="replace", timeout=timeout_s,
                              env=_env(cache), cwd=str(REPO), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"{_show(argv)}: timed out after {timeout_s:.0f} s and was killed") from None
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    child = Child(list(argv), time.perf_counter() - began, proc.returncode, proc.stdout, proc.stderr)
    if proc.returncode not in ok_codes:
        tail = next((line.strip() for line in reversed(proc.stderr.splitlines()) if line.strip()), "no stderr")
        raise ChildFailed(f"{_show(argv)}: exit {proc.returncode}: {tail[:300]}")
    return child


def _show(argv: Sequence[str]) -> str:
    shown = ["python3" if arg == sys.executable else arg for arg in argv]
    if len(shown) > 2 and shown[1] == "-c":
        shown[2] = "<floor script>" if "\n" in shown[2] else repr(shown[2])
    return " ".join(shown)


def _tool(*args: str) -> List[str]:
    return [sys.executable, "-m", "dflash_doctor", *args]


def _report(argv: Sequence[str], timeout_s: float, out: Path) -> tuple:
    """Run a dflash-doctor command writing JSON to `out`; its exit code says the verdict, not a failure, as long
    as the document was written (2 and above without one: a usage or internal error)."""
    child = run_child([*argv, "-f", "json", "-o", str(out), "-q"], timeout_s, ok_codes=range(0, 256))
    try:
        document = json.loads(out.read_text())
    except (OSError, ValueError):
        tail = next((line.strip() for line in reversed(child.stderr.splitlines()) if line.strip()), "no stderr")
        raise ChildFailed(f"{_show(argv)}: exit {child.returncode}, no JSON report: {tail[:300]}") from None
    return child, document


# -- the floors ------------------------------------------------------------------------------------------------
def import_floor(timeout_s: float) -> Tuple[float, float]:
    """(seconds of `import torch; import torch._dynamo` inside a fresh interpreter, that process's wall)."""
    child = run_child([sys.executable, "-c", IMPORT_CODE], timeout_s)
    try:
        return float(child.stdout.split()[-1]), child.wall_s
    except (IndexError, ValueError):
        raise ChildFailed(f"the import floor printed no seconds: {child.stdout.strip()[-200:]!r}") from None


def compile_floor(device: str, preset: Optional[str], timeout_s: float) -> dict:
    child = run_child([sys.executable, "-c", COMPILE_CODE, device, preset or ""], timeout_s)
    try:
        figures = json.loads(child.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise ChildFailed(f"the cold-compile floor printed no figures: {child.stdout.strip()[-200:]!r}") from None
    figures["process_wall_s"] = round(child.wall_s, 3)
    return figures


# -- the rows --------------------------------------------------------------------------------------------------
def measure_guards(repeat: int, limits: "Limits", workdir: Path, run: Run) -> None:
    """guards and the import floor alternately, `repeat` times each: on a shared machine the load drifts."""
    walls, totals, imports, import_walls, notes, breakdown = [], [], [], [], set(), []
    for index in range(repeat):
        inner, outer = import_floor(limits["import"])
        imports.append(inner)
        import_walls.append(outer)
        child, document = _report(_tool("guards"), limits["guards"], workdir / f"guards-{index}.json")
        facts = document["facts"]
        walls.append(child.wall_s)
        totals.append(float(facts["seconds"]["total"]))
        # where guards' seconds went (the probe host's import and total, each probe's own): the profile's figures
        breakdown.append({**facts["seconds"], "probes": {name: detail.get("seconds")
                                                         for name, detail in facts["probe_details"].items()}})
        errors = sorted(name for name, outcome in facts["probes"].items() if outcome == "error")
        if errors:  # a probe that errored ran shorter than one that answered: the figure would flatter guards
            notes.add(f"probes in error: {', '.join(errors)}")
        notes.add(f"exit {child.returncode}, verdict {facts['verdict']}")
    floor = statistics.median(imports)
    run.floors["import_s"] = [round(s, 3) for s in imports]
    run.floors["import_process_wall_s"] = [round(s, 3) for s in import_walls]
    run.measured["guards_wall_s"] = [round(s, 3) for s in walls]
    run.measured["guards_total_s"] = totals
    run.measured["guards_seconds"] = breakdown
    note = "; ".join(sorted(notes)) + f"; median of {repeat}"
    run.rows.append(Row("guards wall", statistics.median(walls), "import torch + torch._dynamo", floor,
                        TARGETS["guards"], note))
    run.rows.append(Row("guards facts.seconds.total", statistics.median(totals), "import torch + torch._dynamo",
                        floor, TARGETS["guards"], note))
    run.rows.append(Row("guards wall", statistics.median(walls), "the import's process wall (start, exit incl.)",
                        statistics.median(import_walls), None, "for reading"))


def measure_repro(device: str, preset: Optional[str], limits: "Limits", workdir: Path, run: Run,
                  compile_s: Optional[float], process_s: Optional[float]) -> None:
    argv = _tool("repro", "--threads", "3", "--device", device, *(["--preset", preset] if preset else []))
    child, document = _report(argv, limits["repro"], workdir / "repro.json")
    facts = document["facts"]
    verdict = float(facts["time_to_verdict_s"])
    run.measured["repro"] = {"time_to_verdict_s": verdict, "wall_s": round(child.wall_s, 3), "exit": child.returncode,
                             "verdict": facts["verdict"], "kind": facts.get("kind"), "level": facts.get("level")}
    note = f"{facts['verdict']} ({facts.get('kind')}) under {facts.get('level')}; wall {child.wall_s:.1f} s"
    run.rows.append(Row("repro --threads 3: time to verdict", verdict, "cold compile (first call)", compile_s,
                        TARGETS["repro"], note))
    run.rows.append(Row("repro --threads 3: time to verdict", verdict, "cold compile (process, imports incl.)",
                        process_s, None, "for reading"))


def measure_matrix(device: str, preset: Optional[str], limits: "Limits", workdir: Path, run: Run,
                   compile_s: Optional[float]) -> None:
    argv = _tool("repro", "--threads", "3", "--shapes", "per-thread", "--matrix", "--device", device,
                 *(["--preset", preset] if preset else []))
    child, document = _report(argv, limits["matrix"], workdir / "matrix.json")
    facts = document["facts"]
    rows = facts.get("matrix") or []
    run.measured["matrix"] = {"wall_s": round(child.wall_s, 3), "exit": child.returncode,
                              "facts_wall_s": facts.get("wall_s"), "partial": facts.get("partial"),
                              "rows": {r.get("mitigation"): r.get("outcome") for r in rows if isinstance(r, dict)}}
    run.rows.append(Row("repro --threads 3 --shapes per-thread --matrix: wall", child.wall_s,
                        "cold compile (first call)", compile_s, TARGETS["matrix"],
                        f"{len(rows)} rows; exit {child.returncode}"))


def profile_host(device: str, limits: "Limits", run: Run) -> None:
    """The probe host's phases, in as many stand-ins side by side as guards starts hosts on this build: one forking
    host on a CPU build, one host per probe on a CUDA one."""
    from concurrent.futures import ThreadPoolExecutor

    names = ["cross_thread_leak", "stuck_flag", "is_compiling_leak", "patcher_race"] if device == "cuda" else [
        "stuck_flag"]
    timeout = limits["guards"]
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        children = list(pool.map(lambda name: run_child([sys.executable, "-c", HOST_PHASES_CODE, name], timeout),
                                 names))
    run.measured["host_phases"] = {name: {**json.loads(child.stdout.strip().splitlines()[-1]),
                                          "process_wall_s": round(child.wall_s, 3)}
                                   for name, child in zip(names, children)}


# -- the run ---------------------------------------------------------------------------------------------------
def _machine(device: str) -> Dict[str, object]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=str(REPO))
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           cwd=str(REPO))
    return {"host": platform.node(), "python": platform.python_version(), "cores": os.cpu_count(), "device": device,
            "commit": commit.stdout.strip() + ("+changes" if dirty.stdout.strip() else ""),
            "load_1m_at_start": round(os.getloadavg()[0], 2)}


class Limits:
    """Each child's timeout: its default times --timeout-scale, and within --budget-s (the whole run's wall clock,
    less a margin for the table and the JSON) when one is given; a child with less than MIN_S left is not run."""

    DEFAULTS = {"import": 120.0, "compile": 600.0, "guards": 180.0, "repro": 600.0, "matrix": 1800.0}
    MARGIN_S = 10.0
    MIN_S = 5.0

    def __init__(self, scale: float, budget_s: Optional[float]) -> None:
        self.scale, self.budget_s, self.began = scale, budget_s, time.monotonic()

    def __getitem__(self, name: str) -> float:
        limit = self.DEFAULTS[name] * self.scale
        if self.budget_s is None:
            return limit
        left = self.budget_s - (time.monotonic() - self.began) - self.MARGIN_S
        if left < self.MIN_S:
            raise ChildFailed(f"not run: {max(0.0, left + self.MARGIN_S):.1f} s of --budget-s {self.budget_s:g} left, "
                              f"{self.MIN_S + self.MARGIN_S:g} s needed")
        return min(limit, left)


def _step(run: Run, what: str, measure, *args, on_step=None) -> None:
    """One measurement; its failure becomes a row saying why, and the run goes on. `on_step(run)` after each (the
    JSON is rewritten then, so a run cut off from outside still leaves what it measured)."""
    run.load.append([what, round(os.getloadavg()[0], 2)])
    began = time.perf_counter()
    sys.stderr.write(f"speed_ratios: {what} ...\n")
    try:
        measure(*args)
    except ChildFailed as exc:
        run.rows.append(Row(what, None, "-", None, None, error=str(exc)))
        sys.stderr.write(f"speed_ratios: {what}: {exc}\n")
    sys.stderr.write(f"speed_ratios: {what}: {time.perf_counter() - began:.1f} s\n")
    if on_step is not None:
        on_step(run)


def measure(device: str, preset: Optional[str], only: Sequence[str], repeat: int, limits: Limits,
            on_step=None, profile: bool = False) -> Run:
    run = Run(device, preset, dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), _machine(device))
    with tempfile.TemporaryDirectory(prefix="speed-ratios-") as folder:
        workdir = Path(folder)

        def first_import() -> None:  # the first import of torch reads its libraries from disk; later ones do not
            run.floors["first_import_s"] = round(import_floor(limits["import"])[0], 3)

        def cold() -> None:
            run.floors["cold_compile"] = compile_floor(device, preset, limits["compile"])

        _step(run, "warm-up import", first_import, on_step=on_step)
        compile_s = process_s = None
        if {"repro", "matrix"} & set(only):
            _step(run, "cold compile", cold, on_step=on_step)
            figures = run.floors.get("cold_compile")
            if isinstance(figures, dict):
                compile_s, process_s = figures["first_call_s"], figures["process_wall_s"]
        if "guards" in only:
            _step(run, "guards", measure_guards, repeat, limits, workdir, run, on_step=on_step)
            if profile:
                _step(run, "probe host phases", profile_host, device, limits, run, on_step=on_step)
        if "repro" in only:
            _step(run, "repro --threads 3", measure_repro, device, preset, limits, workdir, run, compile_s,
                  process_s, on_step=on_step)
        if "matrix" in only:
            _step(run, "repro --matrix", measure_matrix, device, preset, limits, workdir, run, compile_s,
                  on_step=on_step)
    run.load.append(["end", round(os.getloadavg()[0], 2)])
    return run


def _s(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f} s"


def table(run: Run) -> str:
    lines = ["| row | measured | floor | ratio | target | | note |", "|---|---|---|---|---|---|---|"]
    for row in run.rows:
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}x"
        target = "-" if row.target is None else f"<= {row.target:g}x"
        floor = f"{row.floor} {_s(row.floor_s)}" if row.floor_s is not None else row.floor
        note = (row.error or row.note).replace("|", "/")
        lines.append(f"| {row.what} | {_s(row.measured_s)} | {floor} | {ratio} | {target} | {row.status} | {note} |")
    return "\n".join(lines) + "\n"


def _parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="benchmarks/speed_ratios.py", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--only", default=",".join(ROWS), help=f"comma-separated rows among {', '.join(ROWS)}")
    parser.add_argument("--preset", default=None, help="the drafter preset for the floor and both repro rows "
                                                       "(default: repro's own default)")
    parser.add_argument("--repeat", type=int, default=3, help="guards and import runs, interleaved (median kept)")
    parser.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every child's timeout")
    parser.add_argument("--profile", action="store_true",
                        help="with the guards row: time the probe host's phases (import, warm-up compile, a probe, "
                             "the GPU count) in stand-ins, as many side by side as guards starts")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="the whole run's wall clock: each child's timeout is cut to what is left (a device "
                             "call's limit), a row with nothing left says so")
    parser.add_argument("--json", type=Path, default=None,
                        help="write every figure here as JSON (rewritten after each step)")
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(only) - set(ROWS))
    if unknown or not only:
        parser.error(f"--only: unknown row(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(ROWS)}")
    if args.repeat < 1 or args.timeout_scale <= 0 or (args.budget_s is not None and args.budget_s <= 0):
        parser.error("--repeat must be >= 1, --timeout-scale and --budget-s > 0")
    if args.device == "cuda" and shutil.which("nvidia-smi") is None and not Path("/dev/nvidiactl").exists():
        parser.error("--device cuda: no NVIDIA driver on this machine (no nvidia-smi, no /dev/nvidiactl)")
    args.only = only
    return args


def _document(run: Run, argv: Sequence[str]) -> dict:
    return {**{k: v for k, v in asdict(run).items() if k != "rows"},
            "rows": [{**asdict(row), "ratio": row.ratio, "status": row.status} for row in run.rows],
            "command": " ".join(["python3", "benchmarks/speed_ratios.py", *argv])}


def main(argv: Optional[Sequence[str]] = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    args = _parse(given)
    out = args.json

    def save(run: Run) -> None:
        if out is not None:
            out.write_text(json.dumps(_document(run, given), indent=1) + "\n")

    run = measure(args.device, args.preset, args.only, args.repeat, Limits(args.timeout_scale, args.budget_s),
                  on_step=save, profile=args.profile)
    save(run)
    print(f"speed ratios, {run.started_at}, {run.machine['host']} ({run.machine['cores']} cores, load "
          f"{run.machine['load_1m_at_start']} at start), device {run.device}, commit {run.machine['commit']}")
    print(f"floors: {json.dumps(run.floors)}")
    if "host_phases" in run.measured:
        print(f"probe host phases (seconds): {json.dumps(run.measured['host_phases'])}")
    print(table(run), end="")
    print("1-minute load average before each step: " + ", ".join(f"{what} {load}" for what, load in run.load))
    return 0 if all(row.status in ("met", "info") for row in run.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
