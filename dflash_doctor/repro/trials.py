"""The run's phase children and the trials they make up: `Launcher` starts each child in a folder of its own and
remembers every one, `Trial` is one trial in flight (one child, or for `processes` one per worker plus a
disturber) until its typed phase record is in. The harness (harness.py) decides which trials run and when.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from dflash_doctor import mitigations as registry
from dflash_doctor.hazards import Stress
from dflash_doctor.repro import ladder
from dflash_doctor.repro.classify import merge_process_results
from dflash_doctor.repro.phase_record import PhaseRecord
from dflash_doctor.repro.runner import Child, ChildExit, child_env, read_phase_result, write_spec
from dflash_doctor.repro.sharing import SharedCache
from dflash_doctor.repro.spec import PhaseSpec, ReproSpec

CONTROL = "single-thread control"


def trial_key(task: ladder.Task, total: int) -> str:
    """How a trial is named in progress lines: `natural trial 2/3 (mitigation none)`."""
    return f"{task.stress.value} trial {task.index + 1}/{total} (mitigation {registry.label(task.row)})"


def thread_names(count: int) -> List[str]:
    return [f"drafter-{i}" for i in range(count)]


class Launcher:
    """Starts the run's phase children with `runner` (runner.ProcessRunner, warm_start.WarmStartRunner, or a
    test's own) and keeps every one it started, for the run to kill before its folder is removed."""

    def __init__(self, spec: ReproSpec, runner: Any, shared: SharedCache) -> None:
        self.spec, self.runner, self.shared = spec, runner, shared
        self.started: List[Child] = []
        self._phase_counter = 0
        # Trials side by side share the cores: each child's inductor worker pool gets its share, not all of them.
        jobs = spec.effective_jobs
        self.compile_threads = max(2, (os.cpu_count() or 2) // jobs) if jobs > 1 else None

    def phase_spec(self, phase: str, threads: int, mitigation: Tuple[str, ...], names: List[str],
                   stress: Stress) -> PhaseSpec:
        spec = self.spec
        shape_indices = [i if spec.shapes == "per-thread" else 0 for i in range(threads)]
        return PhaseSpec(phase=phase, threads=threads, devices=list(spec.devices), backward=spec.effective_backward,
                         checkpoint=spec.checkpoint, shape_indices=shape_indices, steps=spec.steps,
                         hang_after_s=spec.hang_after_s, mode=stress.value, mitigation=list(mitigation),
                         amplify_ms=spec.amplify_ms, preset=spec.preset, model=spec.model, thread_names=names,
                         disturb_hold_s=spec.timeout_s, model_compile=spec.model_compile, step=spec.step)

    def start_child(self, root: Path, label: str, phase_spec: PhaseSpec,
                    shared_cache: bool = False) -> Tuple[Path, Child]:
        """Start one child in a folder of its own; it compiles into that folder's caches (a cold cache), or with
        `shared_cache` into the one the run's flag-held trials share (ReproSpec.shared_cache_stresses)."""
        self._phase_counter += 1
        phase_dir = root / f"{self._phase_counter:03d}-{label}"
        phase_spec.timing_free = shared_cache
        spec_path = write_spec(phase_dir, phase_spec)
        env = child_env(root / "shared-cache" if shared_cache else phase_dir, self.spec.cache == "cold",
                        compile_threads=self.compile_threads,
                        user_code=self.spec.user_code)
        child = self.runner.start(spec_path, phase_dir / "result.json", env, phase_dir / "log.txt",
                                  user_code=self.spec.user_code)
        self.started.append(child)
        return phase_dir, child

    def clean_caches(self, phase_dirs: Sequence[Path]) -> None:
        if self.spec.cache == "cold":
            for phase_dir in phase_dirs:
                shutil.rmtree(phase_dir / "inductor-cache", ignore_errors=True)
                shutil.rmtree(phase_dir / "triton-cache", ignore_errors=True)


class Trial:
    """One multi-thread trial in flight (or, with no task, the single-thread control): one child, or for
    `processes` one child per worker plus a disturber."""

    def __init__(self, launcher: Launcher, root: Path, task: Optional[ladder.Task], label: str,
                 key: str = "") -> None:
        self.task, self.label, self.launcher, self.key = task, label, launcher, key or CONTROL
        spec = launcher.spec
        self.children: List[Tuple[PhaseSpec, Path, Child]] = []
        self.disturber: Optional[Tuple[PhaseSpec, Path, Child]] = None
        self.exits: Dict[int, ChildExit] = {}
        self.shared_cache = task is not None and spec.shares_cache(task.stress, task.row)
        # Workers held back while the first of them fills the shared cache (_start_processes)
        self.deferred: List[Tuple[Path, str, PhaseSpec]] = []
        if task is None:  # the single-thread control
            self._start(root, label, launcher.phase_spec("single", 1, (), thread_names(1), Stress.NATURAL))
        elif task.row and registry.get(task.row[0]).separate_processes:
            self._start_processes(root, task)
        else:
            self._start(root, label, launcher.phase_spec("multi", spec.threads, task.row,
                                                         thread_names(spec.threads), task.stress))

    def _start(self, root: Path, label: str, spec: PhaseSpec) -> None:
        self.children.append((spec, *self.launcher.start_child(root, label, spec, self.shared_cache)))

    def _start_processes(self, root: Path, task: ladder.Task) -> None:
        launcher, run = self.launcher, self.launcher.spec
        if task.stress in (Stress.FORCED, Stress.STUCK, Stress.FOREIGN_TRACE):
            spec = launcher.phase_spec("disturb", 0, (), [], task.stress)
            self.disturber = (spec, *launcher.start_child(root, f"{self.label}-disturb", spec))
        calm = Stress.AMPLIFIED if task.stress is Stress.AMPLIFIED else Stress.NATURAL
        # Into a shared cache nobody has compiled into yet, the first worker goes alone and the others follow
        # once it ended, each then loading what it compiled: workers alone in their processes cannot race with
        # each other, so when they run cannot change what they meet (ReproSpec.shares_cache).
        one_first = self.shared_cache and not launcher.shared.filled and run.shapes != "per-thread"
        for index, name in enumerate(thread_names(run.threads)):
            spec = launcher.phase_spec("multi", 1, (), [name], calm)
            spec.shape_indices = [index if run.shapes == "per-thread" else 0]
            spec.devices = [run.devices[index % len(run.devices)]]
            if one_first and index > 0:
                self.deferred.append((root, f"{self.label}-proc{index}", spec))
            else:
                self._start(root, f"{self.label}-proc{index}", spec)

    def poll(self) -> Optional[PhaseRecord]:
        """The phase result once every child has ended, else None."""
        timeout = self.launcher.spec.timeout_s
        for index, (_, phase_dir, child) in enumerate(self.children):
            if index not in self.exits:
                ended = child.poll(timeout)
                if ended is not None:
                    self.exits[index] = ended
                    if self.shared_cache:
                        self.launcher.shared.child_ended(phase_dir)
        if self.deferred and 0 in self.exits:  # the first worker has filled the cache: the rest start now
            for root, label, spec in self.deferred:
                self._start(root, label, spec)
            self.deferred.clear()
            return None
        if len(self.exits) < len(self.children):
            return None
        results = [read_phase_result(phase_dir, self.exits[i], spec)
                   for i, (spec, phase_dir, _) in enumerate(self.children)]
        self.launcher.clean_caches([phase_dir for _, phase_dir, _ in self.children])
        if len(results) == 1 and self.disturber is None:
            return results[0]
        merged = merge_process_results(results)
        if self.disturber is not None:
            spec, phase_dir, child = self.disturber
            disturbed = read_phase_result(phase_dir, child.stop(), spec)
            merged = replace(merged, disturbance=f"{disturbed.disturbance} (in a process of its own)")
        return merged

    def kill(self) -> None:
        self.deferred.clear()
        for _, _, child in self.children + ([self.disturber] if self.disturber else []):
            child.kill()
