"""What `isolate-fx-patches` costs an eager module call (dflash_doctor/runtime/fx_patches.py).

    python benchmarks/fx_patches_bench.py            # print the table
    python benchmarks/fx_patches_bench.py --write    # ... and write benchmarks/results/fx_patches.md

Each state runs in a fresh interpreter (the shim changes torch process-wide), `--rounds` rounds of `--calls` calls
of a small eager nn.Linear (the call itself, `__call__`, goes through the dispatcher while a trace is open) and of
an attribute lookup that reaches nn.Module.__getattr__ (`module.weight`), timed with perf_counter_ns:

- bare: torch as installed, no trace running (the anchor);
- isolated, idle: the shim installed, no trace running (nn.Module's dispatchers stay in place from install on;
  the autowrapped functions' only while a trace is);
- isolated, tracing: the shim installed while another thread sits inside symbolic_trace (its forward waits on an
  Event, so it holds no GIL): every call of this thread goes through the dispatcher to the original.

Without the shim the third state cannot be measured: the call raises NameError (the race itself).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results" / "fx_patches.md"
COMMAND = "python benchmarks/fx_patches_bench.py --write"

CHILD = textwrap.dedent("""
    import json, statistics, sys, threading, time
    import torch, torch.fx
    state, rounds, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    if state != "bare":
        from dflash_doctor import runtime
        assert runtime.isolate_fx_patches().state == "installed"
    release, entered = threading.Event(), threading.Event()
    if state == "tracing":
        class Holds(torch.nn.Module):
            def forward(self, x):
                entered.set()
                release.wait(600)
                return x
        threading.Thread(target=lambda: torch.fx.symbolic_trace(Holds()), daemon=True).start()
        entered.wait(30)
    linear, x = torch.nn.Linear(8, 8), torch.zeros(1, 8)
    def per_call(fn):
        best = []
        for _ in range(rounds):
            began = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            best.append((time.perf_counter_ns() - began) / calls)
        return {"median_ns": statistics.median(best), "min_ns": min(best)}
    with torch.no_grad():
        result = {"call": per_call(lambda: linear(x)), "getattr": per_call(lambda: linear.weight),
                  "dispatching": torch.nn.Module.__call__ is not torch.nn.modules.module.Module._wrapped_call_impl}
    release.set()
    print(json.dumps(result))
""")
STATES = (("bare", "torch as installed, no trace running"),
          ("idle", "isolate-fx-patches installed, no trace running"),
          ("tracing", "isolate-fx-patches installed, another thread inside symbolic_trace"))


def measure(state: str, rounds: int, calls: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, state, str(rounds), str(calls)], capture_output=True,
                          text=True, timeout=600, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    if proc.returncode != 0:
        raise SystemExit(f"{state}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def render(results: dict, args, torch_version: str) -> str:
    bare = results["bare"]
    lines = ["# isolate-fx-patches: the cost per eager module call (benchmarks/fx_patches_bench.py)", "",
             f"Command: `{COMMAND}` (`--rounds {args.rounds} --calls {args.calls}`)  ",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, CPython {platform.python_version()}, torch "
             f"{torch_version}; load average at the end: {', '.join(f'{v:.1f}' for v in os.getloadavg())}.", "",
             "| state | nn.Linear(8, 8) call, median (fastest) | over bare | `module.weight` (nn.Module.__getattr__), "
             "median (fastest) | over bare | dispatcher in place |", "|---|---|---|---|---|---|"]
    for state, label in STATES:
        r = results[state]
        lines.append(f"| {label} | {r['call']['median_ns'] / 1000:.2f} us ({r['call']['min_ns'] / 1000:.2f}) | "
                     f"{(r['call']['min_ns'] - bare['call']['min_ns']) / 1000:+.2f} us | "
                     f"{r['getattr']['median_ns']:.0f} ns ({r['getattr']['min_ns']:.0f}) | "
                     f"{r['getattr']['min_ns'] - bare['getattr']['min_ns']:+.0f} ns | {r['dispatching']} |")
    lines += ["", "Differences are of the fastest rounds (noise on shared cores only adds time). From install on the "
              "shim keeps its dispatcher in `nn.Module.__call__` and `__getattr__`, traced or not: a Dynamo compile "
              "in another thread that saw them come and go failed (InternalTorchDynamoError in CLOSURE_MATCH, "
              "'Guard failed on the same frame it was created'; tests/runtime/test_fx_patches.py), so every module "
              "call and module attribute lookup pays one Python call of the dispatcher (a thread-local read and a "
              "dict lookup) whether or not a thread traces. Without the shim the call made while another thread "
              "traces raises NameError instead (the FX patcher race), so there is no faster alternative that runs "
              "it.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {RESULTS.relative_to(REPO)}")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    results = {state: measure(state, args.rounds, args.calls) for state, _ in STATES}
    version = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                             text=True, timeout=120).stdout.strip()
    text = render(results, args, version)
    print(text)
    if args.write:
        RESULTS.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
