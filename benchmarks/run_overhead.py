"""Overhead of `dflash-doctor run`'s bootstrap per training step (target: <= 1 % of a step).

    python benchmarks/run_overhead.py [--device cpu] [--preset tiny] [--pairs 4] [--rounds 5] [--steps 10]
                                      [--out benchmarks/results/run_overhead.md]

Two measurements:
- end to end: the reference drafter step (`--preset`, compiled flex_attention; forward only on a CPU, where
  flex_attention has no backward) timed in child processes started bare and started with the bootstrap in their
  environment exactly as `run` starts them, alternately (bare, run, bare, run, ...) so the machine's noise hits
  both alike; the ratio of medians and of the fastest rounds;
- the steady number: what the agent does while nothing is wrong is its watchdog thread (a poll every 0.2 s, a CPU
  reading every second, a cheap stack pre-check every 1.5 s, all holding the GIL). Its cost per second of wall
  time, measured in a process with a few threads, is the share of a GIL-bound step it can take at most. The <= 1 %
  target is judged on it; the end-to-end ratio is as noisy as the machine.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child(device: str, preset: str, rounds: int, steps: int) -> None:
    from dflash_doctor.reference.replay import build_drafter_step

    step = build_drafter_step(preset=preset, device=device).run
    for _ in range(3):  # compile and settle
        step()
    means = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(steps):
            step()
        if device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
        means.append((time.perf_counter() - started) / steps)
    print(json.dumps({"means": means, "agent": "dflash_doctor.supervise.agent" in sys.modules}))


def run_child(args, with_bootstrap: bool) -> dict:
    from dflash_doctor.supervise.session import RunConfig, Session, child_environment

    base = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    session = Session.create(RunConfig())  # a real session folder and token: the agent checks both
    try:
        env = child_environment(session.path, base, token=session.token) if with_bootstrap else base
        argv = [sys.executable, __file__, "--child", "--device", args.device, "--preset", args.preset,
                "--rounds", str(args.rounds), "--steps", str(args.steps)]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1200, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        session.close(remove=True)


def watchdog_cost(seconds: float = 20.0) -> dict:
    """The agent's watchdog, polled as its thread polls it, with four idle threads beside it: seconds of work per
    second of wall time."""
    from dflash_doctor.runtime.recorder import FlightRecorder
    from dflash_doctor.runtime.watchdog import ProcessTreeCpu, Watchdog
    from dflash_doctor.supervise.agent import Agent

    stop = threading.Event()
    idle = [threading.Thread(target=stop.wait, daemon=True) for _ in range(4)]
    for thread in idle:
        thread.start()
    recorder = FlightRecorder()
    watchdog = Watchdog(lambda: recorder.last_progress, 120.0, lambda report: None, cpu_seconds=ProcessTreeCpu(),
                        precheck=Agent._may_hold_a_cycle, fallback_armed=lambda: True)
    polls, work = 0, 0.0
    ends = time.perf_counter() + seconds
    while time.perf_counter() < ends:
        started = time.perf_counter()
        watchdog.check()
        work += time.perf_counter() - started
        polls += 1
        time.sleep(0.2)
    stop.set()
    return {"polls": polls, "work_s": work, "wall_s": seconds, "share": work / seconds}


def blame_hook_cost(calls: int = 200_000) -> dict:
    """The other per-step cost: every compiled call asks the FX-tracing predicate, which the agent wraps (the
    blame hook). Seconds per call, wrapped minus bare, measured on the installed torch's own predicate."""
    import torch.fx._symbolic_trace as symbolic_trace

    from dflash_doctor.supervise.agent import Agent

    original = symbolic_trace.is_fx_symbolic_tracing
    wrapped = Agent.__new__(Agent)._blaming(original, importlib.import_module("torch._dynamo.config"))

    def per_call(predicate) -> float:
        started = time.perf_counter()
        for _ in range(calls):
            predicate()
        return (time.perf_counter() - started) / calls

    bare = min(per_call(original) for _ in range(3))
    hooked = min(per_call(wrapped) for _ in range(3))
    return {"bare_s": bare, "hooked_s": hooked, "extra_s": hooked - bare}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON (the device round reads it)")
    args = parser.parse_args(argv)
    if args.child:
        child(args.device, args.preset, args.rounds, args.steps)
        return 0
    sys.path.insert(0, str(REPO))
    bare, under = [], []
    for _ in range(args.pairs):
        bare.extend(run_child(args, False)["means"])
        result = run_child(args, True)
        assert result["agent"], "the bootstrap did not load in the child"
        under.extend(result["means"])
    steady = watchdog_cost()
    blame = blame_hook_cost()
    bare_median, under_median = statistics.median(bare), statistics.median(under)
    import torch

    lines = [
        "# `run` bootstrap overhead per step (benchmarks/run_overhead.py)",
        "",
        f"Command: `python benchmarks/run_overhead.py --device {args.device} --preset {args.preset} --pairs "
        f"{args.pairs} --rounds {args.rounds} --steps {args.steps}`",
        f"Machine: {platform.machine()}, CPython {platform.python_version()}, torch {torch.__version__}, "
        f"{os.cpu_count()} cores, load average at the end {', '.join(f'{x:.1f}' for x in os.getloadavg())}. "
        f"Step: reference drafter `{args.preset}`, compiled flex_attention on {args.device}"
        f"{' (forward only: no flex_attention backward on a CPU)' if args.device == 'cpu' else ''}, warm.",
        "",
        "| measure | value |",
        "|---|---|",
        f"| median step, bare child | {bare_median * 1e3:.3f} ms |",
        f"| median step, child started as `run` starts it | {under_median * 1e3:.3f} ms |",
        f"| end to end, ratio of medians | {(under_median / bare_median - 1) * 100:+.2f} % |",
        f"| end to end, ratio of fastest rounds | {(min(under) / min(bare) - 1) * 100:+.2f} % |",
        f"| watchdog work while nothing is wrong ({steady['polls']} polls in {steady['wall_s']:.0f} s) | "
        f"{steady['work_s'] / steady['polls'] * 1e6:.1f} us per poll |",
        f"| that work as a share of wall time (the most it takes from a GIL-bound step) | "
        f"{steady['share'] * 100:.4f} % |",
        f"| blame hook, extra per compiled call (the wrapped FX-tracing predicate) | "
        f"{blame['extra_s'] * 1e9:.0f} ns ({blame['extra_s'] / bare_median * 100:.5f} % of the median step, "
        "for one compiled call per step) |",
        f"| target | <= 1 % of a step: {'met' if steady['share'] <= 0.01 else 'NOT met'} (watchdog share) |",
        "",
        "Per-round mean step (ms), bare / run: "
        + ", ".join(f"{b * 1e3:.1f}/{u * 1e3:.1f}" for b, u in zip(bare, under)),
        "",
        "The end-to-end ratios are only as steady as the machine: on a shared 2-core box whose load average is "
        "several times its cores they swing both ways by tens of per cent, and the fastest rounds of the run "
        "children can beat the bare ones. The watchdog's share and the blame hook's extra time per call are the "
        "steady numbers: in steady state no FX trace and no compile happens, so the recorder's torch hooks do "
        "nothing, and those two are all the bootstrap adds to a step. Once per process the bootstrap costs about "
        "0.1 s of CPU at start-up (importing the agent and psutil), which is not per step.",
    ]
    text = "\n".join(lines) + "\n"
    if args.json:
        args.json.write_text(json.dumps({
            "device": args.device, "preset": args.preset, "torch": torch.__version__,
            "bare_median_step_s": bare_median, "run_median_step_s": under_median,
            "end_to_end_ratio_of_medians": under_median / bare_median,
            "watchdog_share": steady["share"], "watchdog_us_per_poll": steady["work_s"] / steady["polls"] * 1e6,
            "blame_hook_extra_s": blame["extra_s"], "target_met": steady["share"] <= 0.01,
            "bare_means_s": bare, "run_means_s": under}, indent=1), encoding="utf-8")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
