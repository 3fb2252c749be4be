"""The repro harness: single-thread control, then N threads (K trials), each phase in a fresh child process.

`run_repro(spec)` returns a Report whose facts follow the issue's contract and whose exit code is repro's own:
0 not reproduced, 1 reproduced, 3 harness failure (the control failed, a requested mitigation could not be
installed, or a child could not be started). It never prints; `progress(message)` is called as phases run.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from dflash_doctor.findings import Problem, Report
from dflash_doctor.repro.classify import classify_phase, merge_process_results, phase_facts
from dflash_doctor.repro.runner import ProcessRunner, child_env, read_phase_result, write_spec
from dflash_doctor.repro.spec import MATRIX, PhaseSpec, ReproSpec, mitigation_label

EXIT_NOT_REPRODUCED = 0
EXIT_REPRODUCED = 1
EXIT_HARNESS_FAILURE = 3

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


def thread_names(count: int) -> List[str]:
    return [f"drafter-{i}" for i in range(count)]


class Harness:
    def __init__(self, spec: ReproSpec, *, runner=None, progress: Progress = _quiet,
                 clock: Callable[[], float] = time.perf_counter, workdir: Optional[Path] = None) -> None:
        self.spec = spec
        self.runner = runner or ProcessRunner(clock=clock)
        self.progress = progress
        self.clock = clock
        self.workdir = workdir
        self._phase_counter = 0

    # -- one phase ---------------------------------------------------------------------------------------
    def phase_spec(self, phase: str, threads: int, mitigation: Tuple[str, ...], names: List[str],
                   mode: Optional[str] = None) -> PhaseSpec:
        spec = self.spec
        shape_indices = [i if spec.shapes == "per-thread" else 0 for i in range(threads)]
        return PhaseSpec(phase=phase, threads=threads, devices=list(spec.devices), backward=spec.effective_backward,
                         checkpoint=spec.checkpoint, shape_indices=shape_indices, steps=spec.steps,
                         hang_after_s=spec.hang_after_s, mode=mode or spec.mode, mitigation=list(mitigation),
                         amplify_ms=spec.amplify_ms, preset=spec.preset, model=spec.model, thread_names=names,
                         disturb_hold_s=spec.timeout_s)

    def _phase_dir(self, root: Path, label: str) -> Path:
        self._phase_counter += 1
        return root / f"{self._phase_counter:02d}-{label}"

    def start_child(self, root: Path, label: str, phase_spec: PhaseSpec):
        phase_dir = self._phase_dir(root, label)
        spec_path = write_spec(phase_dir, phase_spec)
        env = child_env(phase_dir, self.spec.cache == "cold")
        child = self.runner.start(spec_path, phase_dir / "result.json", env, phase_dir / "log.txt")
        return phase_dir, child

    def run_child(self, root: Path, label: str, phase_spec: PhaseSpec) -> dict:
        phase_dir, child = self.start_child(root, label, phase_spec)
        exit = child.wait(self.spec.timeout_s)
        result = read_phase_result(phase_dir, exit, phase_spec)
        if self.spec.cache == "cold":
            shutil.rmtree(phase_dir / "inductor-cache", ignore_errors=True)
            shutil.rmtree(phase_dir / "triton-cache", ignore_errors=True)
        return result

    def run_single(self, root: Path, mitigation: Tuple[str, ...]) -> dict:
        self.progress("single-thread phase: one worker, compiling from "
                      f"{'a cold' if self.spec.cache == 'cold' else 'the warm'} cache")
        spec = self.phase_spec("single", 1, tuple(m for m in mitigation if m != "processes"), thread_names(1))
        return self.run_child(root, "single", spec)

    def run_multi(self, root: Path, mitigation: Tuple[str, ...], label: str) -> dict:
        threads = self.spec.threads
        self.progress(f"{threads}-thread phase ({label}), mode {self.spec.mode}, mitigation "
                      f"{mitigation_label(mitigation)}")
        if "processes" not in mitigation:
            return self.run_child(root, label, self.phase_spec("multi", threads, mitigation, thread_names(threads)))
        return self.run_processes(root, label)

    def run_processes(self, root: Path, label: str) -> dict:
        """One child per worker, started together; a forced/stuck disturbance gets a process of its own."""
        names = thread_names(self.spec.threads)
        disturber = None
        if self.spec.mode in ("forced", "stuck"):
            disturb_spec = self.phase_spec("disturb", 0, (), [])
            disturber = self.start_child(root, f"{label}-disturb", disturb_spec)
        calm_mode = "amplified" if self.spec.mode == "amplified" else "natural"
        started = []
        for index, name in enumerate(names):
            worker_spec = self.phase_spec("multi", 1, (), [name], mode=calm_mode)
            worker_spec.shape_indices = [index if self.spec.shapes == "per-thread" else 0]
            worker_spec.devices = [self.spec.devices[index % len(self.spec.devices)]]
            started.append((worker_spec, *self.start_child(root, f"{label}-proc{index}", worker_spec)))
        results = []
        for worker_spec, phase_dir, child in started:
            results.append(read_phase_result(phase_dir, child.wait(self.spec.timeout_s), worker_spec))
        merged = merge_process_results(results)
        if disturber is not None:
            phase_dir, child = disturber
            disturbed = read_phase_result(phase_dir, child.stop(), self.phase_spec("disturb", 0, (), []))
            merged["disturbance"] = f"{disturbed.get('disturbance')} (in a process of its own)"
        return merged

    # -- a whole run -------------------------------------------------------------------------------------
    def run(self, matrix: bool = False) -> Report:
        root = Path(tempfile.mkdtemp(prefix="dflash-repro-", dir=self.workdir))
        try:
            return self._run(root, matrix)
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def _run(self, root: Path, matrix: bool) -> Report:
        spec = self.spec
        started = self.clock()
        report = Report(command="repro")
        single = self.run_single(root, () if matrix else spec.mitigation)
        facts = self._base_facts(single)
        facts["single_thread"] = phase_facts(single)
        report.problems.extend(_problems(single))
        if single.get("outcome") != "ok":
            failed = [t for t in single.get("threads", []) if t.get("error")]
            reason = failed[0]["error"] if failed else single.get("crash") or f"outcome {single.get('outcome')}"
            report.problems.append(Problem(
                "single-thread phase", f"the step fails in one thread, so threads cannot be blamed: {reason}",
                "fix the step (or the --model factory) first; the child's log tail is in the JSON facts"))
            facts.update(multi_thread=None, verdict="not-reproduced", kind=None, blame=[],
                         time_to_verdict_s=round(self.clock() - started, 3))
            report.facts = facts
            report.exit_code_override = EXIT_HARNESS_FAILURE
            return report

        rows = MATRIX if matrix else (spec.mitigation,)
        if matrix and spec.mitigation not in rows:
            rows = (spec.mitigation,) + rows
        matrix_rows = []
        headline = None
        for mitigation in rows:
            outcome = self._trials(root, mitigation, started)
            matrix_rows.append(outcome)
            if mitigation == spec.mitigation:
                headline = outcome
        facts.update(
            multi_thread=headline["multi_thread"], verdict=headline["verdict"], kind=headline["kind"],
            blame=headline["blame"], time_to_verdict_s=headline["time_to_verdict_s"], trials=headline["trials"],
            reproduction_rate=headline["reproduction_rate"],
        )
        hang = (headline["multi_thread"] or {}).get("hang")
        facts["hang"] = hang
        if matrix:
            facts["matrix"] = [_matrix_row(row) for row in matrix_rows]
        for row in matrix_rows:
            report.problems.extend(row["problems"])
        from dflash_doctor.repro.advice import next_steps

        facts["next_steps"] = next_steps(facts)
        report.facts = facts
        from dflash_doctor.repro.findings import findings_from_facts

        report.findings.extend(findings_from_facts(facts))
        if report.problems:  # a mitigation that could not be installed, a phase that ran out of time
            report.exit_code_override = EXIT_HARNESS_FAILURE
        else:
            report.exit_code_override = EXIT_REPRODUCED if facts["verdict"] == "reproduced" else EXIT_NOT_REPRODUCED
        return report

    def _trials(self, root: Path, mitigation: Tuple[str, ...], started: float) -> dict:
        label = mitigation_label(mitigation)
        trials, chosen, verdict_at, problems = [], None, None, []
        for trial in range(self.spec.trials):
            result = self.run_multi(root, mitigation, f"multi-{label.replace(',', '+')}-t{trial + 1}")
            kind, blame = classify_phase(result)
            problems.extend(_problems(result))
            if result.get("timed_out_busy"):
                kind, blame = None, []
                problems.append(Problem(
                    f"{self.spec.threads}-thread phase ({label})",
                    f"still making progress when --timeout ({self.spec.timeout_s:.0f} s) ended it: no verdict",
                    "raise --timeout (cold compiles of several shapes take a while on a busy machine)"))
            trials.append({"trial": trial + 1, "outcome": result.get("outcome"), "kind": kind,
                           "seconds": result.get("seconds")})
            if kind is not None and chosen is None:
                chosen, verdict_at = (result, kind, blame), self.clock() - started
            self.progress(f"  trial {trial + 1}/{self.spec.trials}: {result.get('outcome')}"
                          f"{' (' + kind + ')' if kind else ''}")
        if chosen is None:
            chosen, verdict_at = (result, None, []), self.clock() - started
        result, kind, blame = chosen
        multi = phase_facts(result)
        if result.get("processes"):
            multi["processes"] = result["processes"]
        reproduced = sum(1 for t in trials if t["kind"] is not None)
        return {"mitigation": label, "multi_thread": multi, "kind": kind, "blame": blame, "trials": trials,
                "verdict": "reproduced" if kind else "not-reproduced",
                "reproduction_rate": round(reproduced / len(trials), 3),
                "time_to_verdict_s": round(verdict_at, 3), "problems": problems}

    def _base_facts(self, single: dict) -> dict:
        spec = self.spec
        facts = {
            "torch_version": single.get("torch_version"),
            "device": ",".join(spec.devices),
            "threads": spec.threads,
            "mode": spec.mode,
            "mitigation": mitigation_label(spec.mitigation),
            "cache": spec.cache,
            "backward": spec.effective_backward,
            "checkpoint": spec.checkpoint,
            "shapes": spec.shapes,
            "steps": spec.steps,
            "model": spec.model or f"reference drafter ({spec.preset})",
        }
        if spec.mode == "amplified":
            facts["amplify_ms"] = spec.amplify_ms
        if single.get("shim"):
            facts["shim"] = {**single["shim"], "self_check": single.get("shim_check")}
        return facts


def _problems(result: dict) -> List[Problem]:
    return [Problem(p["subject"], p["reason"], p.get("hint", "")) for p in result.get("problems") or []]


def _matrix_row(row: dict) -> dict:
    multi = row["multi_thread"] or {}
    return {"mitigation": row["mitigation"], "verdict": row["verdict"], "outcome": multi.get("outcome"),
            "kind": row["kind"], "steps_per_s": multi.get("steps_per_s"), "seconds": multi.get("seconds"),
            "reproduction_rate": row["reproduction_rate"]}


def run_repro(spec: ReproSpec, *, matrix: bool = False, runner=None, progress: Progress = _quiet,
              clock: Callable[[], float] = time.perf_counter, workdir: Optional[Path] = None) -> Report:
    """Run a repro (or the mitigation matrix) and return its Report; see the module docstring."""
    return Harness(spec.validate(), runner=runner, progress=progress, clock=clock, workdir=workdir).run(matrix)


def trace_phases(facts: dict) -> Sequence[tuple]:
    """(phase name, events) pairs for the Chrome trace: the control, then the reported multi-thread run."""
    phases = [("single-thread", (facts.get("single_thread") or {}).get("events", []))]
    multi = facts.get("multi_thread") or {}
    if multi.get("processes"):
        phases.extend((f"process {', '.join(p['threads'])}", p["events"]) for p in multi["processes"])
    else:
        phases.append((f"{facts.get('threads')} threads", multi.get("events", [])))
    return phases


__all__ = ["EXIT_HARNESS_FAILURE", "EXIT_NOT_REPRODUCED", "EXIT_REPRODUCED", "Harness", "run_repro", "trace_phases"]
