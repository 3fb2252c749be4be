"""`dflash-doctor guards --torch-root` on the real wheels of every torch release from 2.4 to 2.15, checked against
the very source lines it cites; writes the per-hazard table to docs/guards-releases.md.

    python benchmarks/guards_releases.py                    # download (or reuse) the wheels, check, print a summary
    python benchmarks/guards_releases.py --write            # ... and rewrite docs/guards-releases.md and
                                                            #     benchmarks/results/guards_releases.json
    python benchmarks/guards_releases.py --unpacked DIR     # read DIR/<version>/torch (already unpacked) instead

Wheels: the guard, the FX flag, Dynamo, inductor and AOTAutograd are Python, identical in every platform's wheel,
so the smallest wheel that exists is used: CPython 3.11 for macOS arm64 (60-140 MB; the Linux x86_64 wheels are
CUDA builds of 1-2.5 GB), else manylinux aarch64. `pip download --no-deps` runs with PIP_CONFIG_FILE=/dev/null
because a machine-wide pip constraint may cap torch (2.14.1 on ours). Wheels and the unpacked `torch/**/*.py` go
to .whl/torch-releases/ (ignored by git; about 1 GB of wheels and 520 MB of sources for the 12 releases).

Checks (exit 1 when one fails): every file:line a verdict cites holds the name it cites; the release table
(dflash_doctor/guards/releases.py) agrees with each wheel's source; no release whose backward compile takes
compile_lock is called safe; upgrade advice from a release whose backward compile takes no lock says the upgrade
adds the deadlock; non-lazy backward is offered exactly where its switch exists, the thread-local shim exactly
where the FX flag is a module global, single-thread-autograd wherever the deadlock is present, and
isolate-fx-patches wherever the FX patcher race is (or the reason it cannot apply, on 2.4). Anchor for the seconds: `python -m dflash_doctor --help`, same run.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from dflash_doctor.children import child_env, python_argv  # noqa: E402 - after the path set-up above

RELEASES = ("2.4.1", "2.5.1", "2.6.0", "2.7.1", "2.8.0", "2.9.1", "2.10.0", "2.11.0", "2.12.0", "2.13.0", "2.14.1",
            "2.15.0")
CACHE = REPO / ".whl" / "torch-releases"
DOC = REPO / "docs" / "guards-releases.md"
RESULTS = HERE / "results" / "guards_releases.json"
COMMAND = "python benchmarks/guards_releases.py --write"
# Platform tags tried in order, each with every tag pip should accept for it.
PLATFORMS = (
    ("macOS arm64", ("macosx_11_0_arm64", "macosx_12_0_arm64", "macosx_13_0_arm64", "macosx_14_0_arm64",
                     "macosx_15_0_arm64")),
    ("manylinux aarch64", ("manylinux_2_28_aarch64", "manylinux2014_aarch64")),
)
HAZARDS = ("fx-flag-leak", "stuck-flag", "is-compiling-leak", "deadlock", "fx-patcher-race")


def fetch(version: str, cache: Path) -> Tuple[Path, dict]:
    """The unpacked torch/ of `version`, downloading and unpacking its smallest wheel when not cached."""
    source = cache / "src" / version / "torch"
    wheels = cache / "wheels"
    wheel = next(iter(sorted(wheels.glob(f"torch-{version}-*.whl"))), None) if wheels.is_dir() else None
    if wheel is None:
        wheel = _download(version, wheels)
    if not (source / "_dynamo" / "eval_frame.py").is_file():
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if name.startswith("torch/") and name.endswith(".py"):
                    archive.extract(name, source.parent)
    return source, {"wheel": wheel.name, "bytes": wheel.stat().st_size}


def _download(version: str, wheels: Path) -> Path:
    wheels.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull)
    failures = []
    for label, tags in PLATFORMS:
        argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                "--python-version", "3.11", "--dest", str(wheels), f"torch=={version}"]
        for tag in tags:
            argv += ["--platform", tag]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
        found = sorted(wheels.glob(f"torch-{version}-*.whl"))
        if proc.returncode == 0 and found:
            return found[0]
        failures.append(f"{label}: {(proc.stderr.strip().splitlines() or ['no wheel'])[-1]}")
    raise SystemExit(f"no wheel of torch {version}: " + "; ".join(failures))


def run_guards(source: Path) -> Tuple[dict, float]:
    argv = python_argv("dflash_doctor", "guards", "--torch-root", str(source), "--format", "json")
    began = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - began
    try:
        return json.loads(proc.stdout), seconds
    except ValueError as exc:
        raise SystemExit(f"guards --torch-root {source} printed no JSON (exit {proc.returncode}): "
                         f"{proc.stderr.strip()[-500:]}") from exc


def anchor_seconds() -> float:
    began = time.perf_counter()
    subprocess.run(python_argv("dflash_doctor", "--help"), cwd=REPO, env=child_env(), capture_output=True,
                   timeout=120, check=True)
    return time.perf_counter() - began


def _line(path: str, number: int) -> str:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return lines[number - 1] if 0 < number <= len(lines) else ""


def citations(facts: dict) -> List[Tuple[str, int, str]]:
    """(file, line, name) for every line the verdicts and the guard facts cite."""
    cited = [(c["file"], c["line"], c["what"]) for h in facts["hazards"].values() for c in h["cited"]]
    for site in facts["fx_patches"]["class_patches"] + facts["fx_patches"]["name_errors"]:
        cited.append((site["file"], site["line"], site["what"]))
    guard, flag = facts["guard"], facts["fx_flag"]
    if guard.get("file"):
        cited.append((guard["file"], guard["line"], "raise"))
    if flag:
        cited.append((flag["file"], flag["line"], flag["name"]))
    option = facts["backward_compile"]["non_lazy_option"]
    if option:
        cited.append((option["file"], option["line"], "force_non_lazy_backward_lowering"))
    settings = facts["compile_settings"]
    if settings["write_line"]:
        cited.append((settings["file"], settings["write_line"], "user_override" if settings["per_thread"] is not False
                      or "user_override" in _line(settings["file"], settings["write_line"]) else "_config["))
    if settings["contextvar_line"]:
        cited.append((settings["file"], settings["contextvar_line"], "ContextVar"))
    return cited


def check(version: str, document: dict) -> Tuple[List[str], int]:
    """What is wrong with one release's report (empty when nothing), and how many cited lines were read."""
    facts, failures = document["facts"], []
    cited = citations(facts)
    for path, number, what in cited:
        if what not in _line(path, number):
            failures.append(f"{version}: {Path(path).name}:{number} does not hold {what!r}")
    table = facts["corroboration"]
    if not table.get("agrees"):
        failures.append(f"{version}: the release table differs from the source in {table.get('differences')}")
    backward, hazards = facts["backward_compile"], facts["hazards"]
    if backward["takes_compile_lock"] and facts["verdict"] == "safe":
        failures.append(f"{version}: called safe although its backward compile takes compile_lock")
    upgrade = next((f for f in facts["fixes"] if f["kind"] == "upgrade"), None)
    if upgrade and backward["takes_compile_lock"] is False and "deadlock" not in upgrade["adds"]:
        failures.append(f"{version}: the upgrade advice does not say it adds the deadlock")
    non_lazy_offered = "non-lazy-backward" in hazards["deadlock"]["fixes"]
    if hazards["deadlock"]["state"] != "absent" and non_lazy_offered != bool(backward["non_lazy_backward_available"]):
        failures.append(f"{version}: non-lazy backward offered={non_lazy_offered}, switch exists="
                        f"{backward['non_lazy_backward_available']}")
    if hazards["deadlock"]["state"] == "present" and "single-thread-autograd" not in hazards["deadlock"]["fixes"]:
        failures.append(f"{version}: single-thread-autograd not offered for the deadlock")
    patcher = hazards["fx-patcher-race"]
    if patcher["state"] == "present" and "isolate-fx-patches" not in patcher["fixes"] + list(patcher["unavailable"]):
        failures.append(f"{version}: isolate-fx-patches neither offered nor said to be unavailable")
    settings = facts["compile_settings"]
    if settings["per_thread"] is None:
        failures.append(f"{version}: where an assigned compile setting lives was not read")
    elif settings["per_thread"] and not any(c.startswith("non-lazy-backward:") for c in settings["consequences"]):
        failures.append(f"{version}: compile settings per thread, but no consequence named for non-lazy-backward")
    shim_offered = "threadlocal-flag" in hazards["fx-flag-leak"]["fixes"]
    if shim_offered != (facts["fx_flag_storage"] == "module-global"):
        failures.append(f"{version}: thread-local shim offered={shim_offered}, FX flag {facts['fx_flag_storage']}")
    return failures, len(cited)


def _where(site: Optional[dict], root: str) -> str:
    if not site:
        return "-"
    return f"`{os.path.relpath(site['file'], root)}:{site['line']}`"


def _settings_cell(settings: dict, root: str) -> str:
    write = {"file": settings["file"], "line": settings["write_line"]} if settings["write_line"] else None
    cell = f"**{settings['storage']}** {_where(write, root)}"
    if settings["contextvar_line"]:
        cell += f", ContextVar {_where({'file': settings['file'], 'line': settings['contextvar_line']}, root)}"
    return cell


def _fix_label(fix: dict) -> str:
    if fix["kind"] == "mitigation":
        return fix["mitigation"] + ("" if fix["complete"] else f" (leaves {', '.join(fix['gaps'])})") + (
            f" [{fix['evidence_label']}]" if fix.get("evidence_label") else "")
    return fix["kind"] + (f" to {fix['to']}" if fix["kind"] == "upgrade" else "")


def render(rows: Sequence[dict], anchor: float, machine: str, failures: Sequence[str], cited: int) -> str:
    out = ["# torch 2.4-2.15: what `dflash-doctor guards` decides on each release", "",
           "<!-- Generated by `" + COMMAND + "`; do not edit by hand. -->", "",
           f"Command: `{COMMAND}`  ",
           f"Date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; {machine}.  ",
           "Source: each release's wheel from PyPI (`PIP_CONFIG_FILE=/dev/null pip download --no-deps`), only "
           "`torch/**/*.py` unpacked; every row is `dflash-doctor guards --torch-root <wheel>/torch --format json`.",
           "", "## Verdict per hazard", "",
           "| torch | FX-flag leak | stuck flag | is-compiling leak | compile-lock deadlock | FX patcher race "
           "(conditional) | headline (worst) | guards s |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        facts = row["facts"]
        cells = [("**present**" if facts["hazards"][h]["state"] == "present" else facts["hazards"][h]["state"])
                 for h in HAZARDS]
        out.append(f"| {row['version']} | " + " | ".join(cells)
                   + f" | {facts['verdict']} ({facts['worst_hazard'] or '-'}) | {row['seconds']:.2f} |")
    out += ["", f"Anchor in the same run: `python -m dflash_doctor --help` took {anchor:.2f} s, so reading a release "
            f"costs {min(r['seconds'] for r in rows) / anchor:.1f}-{max(r['seconds'] for r in rows) / anchor:.1f}x "
            "the tool's start-up.", "",
            "## What decided it (file:line in each wheel)", "",
            "| torch | guard raise (wrapper, predicate) | FX flag | is_compiling set by a Dynamo compile | "
            "backward compile takes compile_lock | lazy backward compile | non-lazy switch | nn.Module patched "
            "on the class, patcher | compile settings (assigned value) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        facts, root = row["facts"], row["root"]
        guard, flag, compiling, backward = (facts["guard"], facts["fx_flag"], facts["compiling_flag"],
                                            facts["backward_compile"])
        flag_cell = f"{flag['storage']} {_where(flag, root)}" if flag else "unknown"
        masking = compiling["masking"]
        masking_cell = f"yes {_where(masking, root)}" if masking else "no (export only)"
        lock = backward["lock"]
        lock_cell = (f"yes: {' -> '.join(backward['path'])} {_where(lock, root)}" if lock
                     else f"no: {backward['path'][0]} {_where(backward['compiler'], root)}")
        lazy = backward["lazy"]
        patches = facts["fx_patches"]
        patched = patches["class_patches"]
        patcher_cell = (f"{', '.join(s['what'] for s in patched)} {_where(patched[0] if patched else None, root)}; "
                        f"{patches['patcher_storage'] or ('each trace its own (no CURRENT_PATCHER)' if patched else 'unknown')} "
                        f"{_where(patches['patcher'], root) if patches['patcher'] else ''}").strip()
        out.append(f"| {row['version']} | `{guard['function']}` {_where(guard, root)} `{guard['predicate']}()` | "
                   f"{flag_cell} | "
                   f"{masking_cell} | {lock_cell} | {lazy['function'] if lazy else '-'} {_where(lazy, root)} | "
                   f"{_where(backward['non_lazy_option'], root) if backward['non_lazy_option'] else 'none'} | "
                   f"{patcher_cell} | {_settings_cell(facts['compile_settings'], root)} |")
    holders = [(r["version"], r["facts"]["backward_compile"]["holder"]) for r in rows]
    functions = sorted({holder["function"] for _, holder in holders if holder})
    out += ["", "The Dynamo compile holding the lock on the other side of the cycle, in "
            "`torch/_dynamo/convert_frame.py`: " + ", ".join(f"`{name}`" for name in functions) + " ("
            + ", ".join(f"{version}: line {holder['line'] if holder else '-'}" for version, holder in holders) + ").",
            "", "## Fixes ranked per release", "",
            "From `dflash_doctor.mitigations.recommend(hazards, release)` (the advice `repro`, `explain` and the "
            "README share), with restart/config advice first when the live state calls for it (never, from a "
            "source tree) "
            "and the upgrade placed after the complete fixes, or last when it trades one hazard for another. "
            "Each fix says whether it was measured on that release (`measured (2.11, H200)`) or is inferred from a "
            "measurement on another release and this release's source. The FX patcher race is conditional (it "
            "needs a thread running its own FX trace), so it is not in these rankings; every fix that leaves it "
            "open says so in its caveats, and with a tracing thread `recommend` adds isolate-fx-patches.", "",
            "| torch | ranked fixes | upgrade advice |", "|---|---|---|"]
    for row in rows:
        facts = row["facts"]
        ranked = "; ".join(f"{f['rank']}. {_fix_label(f)}" for f in facts["fixes"])
        upgrade = next((f["fix"] for f in facts["fixes"] if f["kind"] == "upgrade"), "none (no later release in the "
                       "table has a thread-local flag where this one lacks it)")
        out.append(f"| {row['version']} | {ranked} | {upgrade} |")
    out += ["", "## Checks", "",
            f"- {cited} cited lines read back from the wheels; each holds the name it is cited for.",
            f"- The release table in `dflash_doctor/guards/releases.py` agrees with "
            f"{sum(1 for r in rows if r['facts']['corroboration']['agrees'])} of {len(rows)} wheels.",
            "- No release whose backward compile takes compile_lock is called safe; the upgrade advice from a "
            "release whose backward compile takes no lock says that the upgrade adds the deadlock; non-lazy backward "
            "is offered exactly where `torch._functorch.config.force_non_lazy_backward_lowering` exists, the "
            "thread-local shim exactly where the FX flag is a module global, single-thread-autograd wherever the "
            "deadlock is present, isolate-fx-patches wherever the FX patcher race is (on 2.4 with the reason it cannot "
            "apply there); where an assigned compile setting lives is read on every release, and where it is per "
            "thread the consequence for non-lazy-backward is named.",
            "- Failures: " + ("none" if not failures else "; ".join(failures)), ""]
    out += [NOTES]
    return "\n".join(out)


NOTES = """## The hazards, and how `guards` decides each

Each is decided from the source that was read (`dflash_doctor/guards/verdict.py`); where the installed torch is
probed live, a probe can add to it (a reproduction makes a hazard present; a probe that does not reproduce settles
one the source left unknown). The headline is `vulnerable` when any hazard is present, `unknown` when none is but
one could not be told, and `safe` only when every hazard is absent. A conditional hazard (the FX patcher race)
is decided the same way but left out of the headline: it needs a thread running its own FX trace.

- **FX-flag leak across threads.** Every call of a `torch.compile`d function goes through the compile wrapper in
  `torch/_dynamo/eval_frame.py` (`_fn` up to 2.7, `compile_wrapper` from 2.8), which raises "Detected that you are
  using FX to symbolically trace a dynamo-optimized function" when its predicate is true (`is_fx_tracing()` up to
  2.8, `is_fx_symbolic_tracing()` from 2.9). The predicate reads `torch.fx._symbolic_trace`'s flag, which
  `Tracer.trace` sets. Present when that flag is a module global (2.4-2.13): a trace in any thread (make_fx inside
  another thread's compile, or any `torch.fx` trace) makes every thread's compiled calls raise. 2.14 keeps it in a
  `threading.local()`.
- **Stuck FX flag.** `Tracer.trace` saves, sets and restores the flag: when two traces in two threads exit out of
  order, the second restores the True it saw on entry and the flag stays True for good, so every later compiled
  call in the process raises. Present with a module-global flag; also present when the live flag is True now.
- **is-compiling leak across threads.** `torch.compiler.is_compiling()` reads a module global in every release.
  From 2.13 Dynamo's `_compile` enters `torch.compiler._compile_session_context()`, which holds it True for the
  whole compile, so every thread sees `is_compiling()` while any thread compiles (it also masks the FX guard during
  compiles). Before 2.13 only `torch.export` sets it.
- **Compile-lock / autograd-device-thread deadlock.** Three conditions, each read from the source
  (`dflash_doctor/guards/backward.py`): a Dynamo compile holds `torch._dynamo.convert_frame.compile_lock`; the
  backward compiler inductor hands AOTAutograd (`bw_compiler=` in `torch/_inductor/compile_fx.py`) takes the same
  lock, itself (2.6-2.8) or through `compile_fx_backward` (2.9-2.15); and AOTAutograd compiles the backward
  lazily, at the first backward call (`compiled_bw = ...bw_compiler(...)` in
  `torch/_functorch/_aot_autograd/runtime_wrappers.py`), on the thread that runs the backward, which for GPU
  tensors is the autograd engine's device thread. Then thread B, compiling under the lock, reaches AOTAutograd's
  joint trace, which calls `torch.autograd.grad` and waits for that device thread, while the device thread runs
  thread A's first backward and waits for the lock. Absent in 2.4-2.5, whose backward compiler takes no lock.
- **FX patcher race across threads (conditional).** `Tracer.trace` opens `_new_patcher()` and calls
  `patcher.patch_method(torch.nn.Module, "__getattr__" | "__call__", ...)`: the methods are replaced on the class,
  so for every thread, for the length of the trace, and the active patcher is the module global
  `CURRENT_PATCHER` (`dflash_doctor/guards/patcher.py`). While one thread traces, another thread's eager module
  call runs the tracer's wrapper and raises `NameError: module is not installed as a submodule` (the cited
  `path_of_module` lines); two overlapping traces restore each other's patches and end in `AssertionError:
  CURRENT_PATCHER is None in finally block`. Present where the class is patched and the patcher is a module global
  (every release read), absent where the patcher is per thread. The live probe runs the minimal case: an eager
  `nn.Linear` in one thread while another sits inside `symbolic_trace`.

- **Compile settings per thread (2.12 and later; not a hazard of its own, a condition on every config-based fix).**
  `ConfigModule.__setattr__` in `torch/utils/_config_module.py` (what `torch._functorch.config.x = v` runs) stores
  the value with `user_override.set(value)` in a `ContextVar` made per key in `_ConfigEntry` from 2.12 on; up to
  2.11 it stores it on the module's own entries (`self._config[name].user_override = value`, 2.6-2.11;
  `self._config[name] = value`, 2.4-2.5), which every thread shares. Per thread, a thread started later reads the
  default: `force_non_lazy_backward_lowering` set once in main leaves every worker's backward lazy, and
  `error_on_nested_fx_trace = False` set in main leaves the workers raising. DFD611 names it with the consequence
  for every config-based fix; `dflash_doctor.runtime.enable_non_lazy_backward()` sets the switch in every thread
  started after it (docs/races.md).

### The deadlock, as measured

On one NVIDIA H200 (torch 2.11.0+cu130, triton 3.6.0, cold compile cache), three threads each running compiled
`flex_attention` forward and backward deadlocked every time (3 of 3 runs, same or different shapes, with or without
`checkpoint(use_reentrant=False)`); two threads with different shapes deadlocked too. All-thread stack dumps showed
the cycle above: one thread in Dynamo's `_compile` holding `compile_lock` while AOTAutograd's joint trace waited in
`torch.autograd.grad`, and the CUDA device thread in `compile_fx_backward` waiting for `compile_lock`. With
`torch._functorch.config.force_non_lazy_backward_lowering = True` (the backward compiled with the forward) there
was no deadlock, but the FX RuntimeError in one thread (2 of 2 runs with different shapes): the longer compile
leaks the module-global FX flag into warm threads. A thread-local FX-flag shim alone still deadlocked. The shim
together with non-lazy backward was the only configuration in which three threads compiled concurrently with
neither error nor hang (12.9 s). A single-thread warm-up of every shape (15.6 s, then 60 steps in 0.27 s) and one
global lock around every step (15.8 s for 60 steps) also held. With several GPUs each device has its own autograd
thread, so the cycle needs two threads on one device.

### What is not read

- Only calls inside `torch/_inductor/compile_fx.py` are followed from the backward compiler. 2.15 also takes
  `compile_lock` in `torch/_inductor/codegen/common.py`, around an out-of-tree PrivateUse1 backend's registration
  hook; that path is not followed (it is not taken for CUDA or CPU).
- With dynamic shapes, when the forward saves symbolic sizes for the backward (`num_symints_saved_for_bw > 0`),
  AOTAutograd compiles the backward eagerly even without the switch; the lazy path is the static-shape default.
- On a CPU the backward runs in the calling thread, not a device thread, so the cycle needs GPU tensors; the
  verdict says what the release can do on a GPU.
- With `--torch-root` no probe runs and nothing about the host (caches, environment, live config) is reported:
  the probes would test the importable torch, not the tree.
- A release outside the table in `dflash_doctor/guards/releases.py` is decided from its source alone; the output
  says the table was not consulted. The table is only corroboration, and the source of the releases the upgrade
  advice names.
"""


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {DOC.relative_to(REPO)} and "
                                                             f"{RESULTS.relative_to(REPO)}")
    parser.add_argument("--cache", type=Path, default=CACHE, help="where wheels and sources go (default %(default)s)")
    parser.add_argument("--unpacked", type=Path, default=None,
                        help="read DIR/<version>/torch instead of downloading")
    parser.add_argument("--releases", nargs="*", default=list(RELEASES))
    args = parser.parse_args(argv)
    anchor = anchor_seconds()
    rows, failures, cited = [], [], 0
    for version in args.releases:
        if args.unpacked is not None:
            source, wheel = args.unpacked / version / "torch", {"wheel": None, "bytes": None}
        else:
            source, wheel = fetch(version, args.cache)
        document, seconds = run_guards(source)
        problems, count = check(version, document)
        failures += problems
        cited += count
        rows.append({"version": version, "root": str(source.parent), "seconds": seconds, **wheel,
                     "facts": document["facts"], "exit_code": document["exit_code"]})
        states = " ".join(f"{h}={document['facts']['hazards'][h]['state']}" for h in HAZARDS)
        print(f"{version:7} {document['facts']['verdict']:10} {states}  {seconds:.2f} s"
              + ("" if not problems else "  FAILED: " + "; ".join(problems)))
    machine = (f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; wheels: "
               + ", ".join(f"{r['wheel']} ({r['bytes'] / 1e6:.0f} MB)" for r in rows if r["wheel"]))
    print(f"anchor `python -m dflash_doctor --help`: {anchor:.2f} s; {cited} cited lines checked; "
          f"{len(failures)} failure(s)")
    if args.write:
        DOC.write_text(render(rows, anchor, machine, failures, cited), encoding="utf-8")
        summary: Dict[str, object] = {
            "command": COMMAND, "anchor_help_s": round(anchor, 3), "cited_lines_checked": cited,
            "failures": failures,
            "releases": [{"version": r["version"], "wheel": r["wheel"], "wheel_bytes": r["bytes"],
                          "seconds": round(r["seconds"], 3), "verdict": r["facts"]["verdict"],
                          "worst_hazard": r["facts"]["worst_hazard"],
                          "hazards": {h: r["facts"]["hazards"][h]["state"] for h in HAZARDS},
                          "fixes": [_fix_label(f) for f in r["facts"]["fixes"]],
                          "table_agrees": r["facts"]["corroboration"]["agrees"]} for r in rows]}
        RESULTS.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
