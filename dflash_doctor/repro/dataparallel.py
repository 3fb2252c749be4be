"""`repro --mode dataparallel`: nn.DataParallel's replica threads over a compiled model, each form in its own child.

nn.DataParallel runs each replica's forward in a thread of its own (`parallel_apply`), and the Hugging Face
Trainer wraps the model in it on a machine with several GPUs started without a launcher. The replay builds the
forms trainers write and runs a few training steps of each in a fresh process (dataparallel_child.py), with the
replicas on one device repeated (`device_ids=[0, 0, 0]` keeps one thread per replica), or on a CPU through the
stand-in of dataparallel_cpu.py, which replays the same threads where torch refuses to.

The baseline form, `nn.DataParallel(torch.compile(model))`, fails at its first step on every release read (2.11
through 2.15): DataParallel's `replicate` calls `_replicate_for_data_parallel()` on the compiled wrapper, whose
`__setattr__` forwards the replica's `_parameters = {}` and `_modules = {'_orig_mod': model}` to the wrapped
model, so the user's own model loses its parameters and submodules and becomes its own child. The error the
replica thread raises is a consequence (AttributeError on torch 2.13 CPU, a RecursionError in Dynamo's guard
building on torch 2.11 H100: docs/races.md, "nn.DataParallel"). No second thread is needed: the corruption
happens in the caller before any replica thread starts. The fixes (dflash_doctor/dataparallel.py) are forms that
avoid it, each run and checked the same way. Importing this module never imports torch.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Tuple

from dflash_doctor.dataparallel import BASELINE, FIX_BY_NAME, FIXES, DataParallelForm
from dflash_doctor.errors import UsageError
from dflash_doctor.findings import Problem, Report
from dflash_doctor.outcomes import FailureKind, ThreadOutcome
from dflash_doctor.progress import EventKind, ProgressEvent, Reporter, silent
from dflash_doctor.repro.dataparallel_facts import DataParallelFacts, FixFacts, FormFacts, MeasuredFacts
from dflash_doctor.wire import exact_fields

EXIT_NOT_REPRODUCED, EXIT_REPRODUCED, EXIT_HARNESS_FAILURE = 0, 1, 3
RESULT_VERSION = 1  # of FormSpec (spec.json, parent to child) and FormResult (result.json, child to parent)


@dataclass
class FormSpec:
    """What one child is told; travels as JSON."""

    form: str
    device: str
    replicas: int
    steps: int
    width: int

    def to_dict(self) -> dict:
        return {"version": RESULT_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "FormSpec":
        """Strict, as FormResult.from_dict: this version, every field and no other."""
        return cls(**exact_fields(cls, data, RESULT_VERSION, "DataParallel form spec"))


@dataclass
class FormResult:
    """What one child found; the child writes it, the parent reads it with from_dict (a missing field fails)."""

    form: str
    device: str
    replicas: int
    outcome: str = ThreadOutcome.RUNNING.value
    steps: int = 0
    step_s: List[float] = field(default_factory=list)
    seconds: float = 0.0
    error: Optional[str] = None
    traceback: Optional[str] = None
    model_intact: Optional[bool] = None  # the user's model still has its own submodules after the steps
    model_tree_after: List[str] = field(default_factory=list)
    graphs: int = 0  # graphs Dynamo compiled in the process (0: everything ran uncompiled)
    torch_version: Optional[str] = None
    version: int = RESULT_VERSION

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "FormResult":
        """Strict: this version, every field to_dict writes and no other (a field dropped or renamed in the child
        fails here, never reads as its default)."""
        return cls(**exact_fields(cls, data, RESULT_VERSION, "DataParallel form result"))


def parse_fixes(text: str) -> Tuple[str, ...]:
    """--mitigation in this mode: none, or the DataParallel fixes by name."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if names in ((), ("none",)):
        return ()
    unknown = [name for name in names if name not in FIX_BY_NAME]
    if unknown:
        raise UsageError(f"--mode dataparallel takes --mitigation none or {', '.join(FIX_BY_NAME)}; "
                         f"got {', '.join(unknown)}")
    return names


def classify(result: FormResult) -> Optional[FailureKind]:
    """The failure a form ended in; None when every step ran and the user's model is as it was."""
    if result.outcome == ThreadOutcome.OK and result.model_intact is not False:
        return None
    if result.model_intact is False:
        return FailureKind.DATAPARALLEL_COMPILED_MODULE
    from dflash_doctor.repro.classify import is_fx_error_text

    if is_fx_error_text(result.error) or is_fx_error_text(result.traceback):
        return FailureKind.FX_FLAG_LEAK
    return FailureKind.OTHER_ERROR


@dataclass(frozen=True)
class DataParallelSpec:
    replicas: int = 3
    device: str = "cpu"
    steps: int = 3
    fixes: Tuple[str, ...] = ()  # () runs every form
    timeout_s: float = 300.0
    width: int = 0  # 0: 256 on a GPU, 64 on a CPU

    def forms(self) -> Tuple[DataParallelForm, ...]:
        if not self.fixes:
            return tuple(DataParallelForm)
        return (BASELINE,) + tuple(FIX_BY_NAME[name].form for name in self.fixes)


Runner = Callable[[FormSpec, Path, float], FormResult]


def run_form_child(spec: FormSpec, folder: Path, timeout_s: float) -> FormResult:
    """One form in a fresh interpreter (children.py: never imports from the working folder), killed at the
    timeout (the result then says it hung)."""
    import subprocess

    from dflash_doctor import children

    folder.mkdir(parents=True, exist_ok=True)
    spec_path, out = folder / "spec.json", folder / "result.json"
    spec_path.write_text(json.dumps(spec.to_dict()), encoding="utf-8")
    log = open(folder / "log.txt", "wb")
    try:
        proc = children.popen(children.python_argv("dflash_doctor.repro.dataparallel_child", str(spec_path),
                                                   str(out)), stdout=log, stderr=subprocess.STDOUT,
                              env=children.child_env(extra={"TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"),
                                                            "TRITON_CACHE_DIR": str(folder / "triton")}))
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            children.stop_all(reopen=True)  # its group: the child and the processes it spawned
            return FormResult(spec.form, spec.device, spec.replicas, outcome=ThreadOutcome.HUNG.value,
                              error=f"no result after {timeout_s:.0f} s: killed", seconds=timeout_s)
        except BaseException:  # Ctrl-C or SIGTERM: no child outlives the run
            children.stop_all(reopen=True)
            raise
        children.release(proc.pid)
    finally:
        log.close()
    if not out.exists():
        tail = (folder / "log.txt").read_bytes()[-1500:].decode("utf-8", "replace")
        return FormResult(spec.form, spec.device, spec.replicas, outcome=ThreadOutcome.ERROR.value,
                          error=f"the child exited {proc.returncode} without a result: {tail}")
    try:
        return FormResult.from_dict(json.loads(out.read_text(encoding="utf-8")))
    except ValueError as exc:  # not JSON, or not a result of this version: the form could not be judged
        return FormResult(spec.form, spec.device, spec.replicas, outcome=ThreadOutcome.ERROR.value,
                          error=f"the child left a result this dflash-doctor cannot read: {exc}")


def run_dataparallel(spec: DataParallelSpec, *, runner: Runner = run_form_child, progress: Reporter = silent,
                     clock: Callable[[], float] = time.perf_counter) -> Report[DataParallelFacts]:
    """Every form asked for, one child each, one after another (each compiles cold, in its own cache)."""
    started = clock()
    width = spec.width or (64 if spec.device == "cpu" else 256)
    root = Path(tempfile.mkdtemp(prefix="dflash-dataparallel-"))
    rows: List[FormFacts] = []
    try:
        for form in spec.forms():
            progress(ProgressEvent(EventKind.STARTED, form.value, form.code, round(clock() - started, 3)))
            result = runner(FormSpec(form.value, spec.device, spec.replicas, spec.steps, width), root / form.value,
                            spec.timeout_s)
            kind = classify(result)
            said = f"reproduced ({kind})" if kind else f"ok, {result.steps} steps, {result.graphs} graph(s)"
            progress(ProgressEvent(EventKind.FINISHED, form.value, said, round(clock() - started, 3)))
            rows.append(form_facts(form, result, kind))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return build_report(spec, rows, round(clock() - started, 3))


def form_facts(form: DataParallelForm, result: FormResult, kind: Optional[FailureKind]) -> FormFacts:
    fix = next((f for f in FIXES if f.form is form), None)
    facts: FormFacts = {"form": form.value, "code": form.code, "outcome": result.outcome, "kind": kind, "steps": result.steps,
             "seconds": result.seconds, "step_s": result.step_s, "graphs": result.graphs,
             "model_intact": result.model_intact, "model_tree_after": result.model_tree_after,
             "error": result.error, "traceback": result.traceback, "torch_version": result.torch_version,
             "fix": fix.name if fix else None}
    if fix is not None:
        held = kind is None and result.outcome == ThreadOutcome.OK
        facts["fix_outcome"] = "holds" if held and result.graphs else ("ran-uncompiled" if held else "fails")
    return facts


def _fix_facts() -> List[FixFacts]:
    return [{"name": f.name, "form": f.form.value, "api": f.api, "caveat": f.caveat, "registry_entry": f.registry_entry,
             "measured": [MeasuredFacts(torch=m.torch, machine=m.machine, showed=m.showed) for m in f.measured]}
            for f in FIXES]


def build_report(spec: DataParallelSpec, rows: List[FormFacts], wall_s: float) -> Report[DataParallelFacts]:
    from dflash_doctor.rules import repro as rules

    report: Report[DataParallelFacts] = Report(command="repro")
    baseline = next((row for row in rows if row["form"] == BASELINE.value), None)
    reproduced = baseline is not None and baseline["kind"] is not None
    facts: DataParallelFacts = {"mode": "dataparallel", "device": spec.device, "threads": spec.replicas, "replicas": spec.replicas,
             "torch_version": next((r["torch_version"] for r in rows if r["torch_version"]), None),
             "mitigation": ",".join(spec.fixes) or "none", "steps": spec.steps,
             "verdict": "reproduced" if reproduced else ("not-reproduced" if baseline else None),
             "kind": baseline["kind"] if baseline else None, "forms": rows, "wall_s": wall_s,
             "fixes": _fix_facts()}
    if spec.device == "cpu":
        facts["cpu_note"] = ("on a CPU torch runs no replicas (parallel_apply refuses: no accelerator); the replay "
                             "ran torch's DataParallel.forward with CPU device steps in the same threads "
                             "(repro/dataparallel_cpu.py); no streams, devices or autograd device thread")
    report.facts = facts
    if reproduced and baseline is not None:
        kind = baseline["kind"]
        rule = rules.DATAPARALLEL_COMPILED_MODULE if kind == FailureKind.DATAPARALLEL_COMPILED_MODULE else (
            rules.FX_FLAG_LEAK if kind == FailureKind.FX_FLAG_LEAK else rules.THREADED_STEP_FAILED)
        report.findings.append(rule.finding(
            f"{BASELINE.code} failed at step {baseline['steps'] + 1}: {(baseline['error'] or '').splitlines()[0]}",
            evidence={"form": BASELINE.value, "model_intact": baseline["model_intact"],
                      "model_tree_after": baseline["model_tree_after"], "device": spec.device,
                      "torch_version": facts["torch_version"]}))
    for row in rows:
        if row["outcome"] == ThreadOutcome.HUNG.value:
            report.problems.append(Problem(f"dataparallel {row['form']}", row["error"] or "hung",
                                           "raise --timeout (a cold compile takes a while on a busy machine)"))
    report.exit_code_override = (EXIT_HARNESS_FAILURE if baseline is None or baseline["outcome"] ==
                                 ThreadOutcome.HUNG.value else EXIT_REPRODUCED if reproduced else EXIT_NOT_REPRODUCED)
    report.summary = ("reproduced: " + str(facts["kind"])) if reproduced else "not reproduced"
    return report
