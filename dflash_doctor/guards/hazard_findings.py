"""Findings (DFD6xx) for the hazards a layout or a set of guards facts shows. Plain functions of their input, so
the rules' examples (stand-in layouts, JSON state) run through exactly the code the command uses.
"""
from __future__ import annotations

import json
from typing import List, Mapping

from dflash_doctor.errors import UsageError
from dflash_doctor.findings import Finding
from dflash_doctor.guards.layout import Layout, read_layout_text
from dflash_doctor.guards.probes import PROBES
from dflash_doctor.outcomes import ProbeOutcome
from dflash_doctor.guards.state import CONFIG_DEFAULTS
from dflash_doctor.guards.verdict import PRESENT, evidence_of, source_states
from dflash_doctor.hazards import Hazard
from dflash_doctor.rules import guards as rules


def layout_findings(layout: Layout) -> List[Finding]:
    """A finding for each hazard the source shows present (verdict.source_states decides)."""
    findings = []
    states = source_states(evidence_of(layout))
    flag, guard = layout.fx_flag, layout.guard
    if states[Hazard.FX_FLAG_LEAK] == PRESENT and flag is not None and guard is not None:
        message = (
            f"{flag.name} is a module global: while any thread is inside {flag.writer or 'an FX trace'}, "
            f"`{guard.predicate}()` in {guard.function} ({guard.file}:{guard.line}) is true for every thread, "
            "so their compiled calls raise"
        )
        if flag.restores_saved_value:
            message += "; its save/set/restore sticks at True when two traces exit out of order"
        findings.append(rules.FX_FLAG_MODULE_GLOBAL.finding(
            message, path=flag.file, line=flag.line, column=1,
            evidence={"flag": flag.name, "writer": flag.writer, "writer_line": flag.writer_line,
                      "restores_saved_value": flag.restores_saved_value, "guard_file": guard.file,
                      "guard_line": guard.line, "predicate": guard.predicate},
        ))
    compiling, masking = layout.compiling_flag, layout.masking
    if states[Hazard.IS_COMPILING_LEAK] == PRESENT and compiling is not None and masking is not None:
        findings.append(rules.COMPILING_FLAG_PROCESS_GLOBAL.finding(
            f"{compiling.name} is a module global that {masking.function} ({masking.file}:{masking.line}) holds "
            "True for the whole compile: every thread sees torch.compiler.is_compiling() while any thread compiles",
            path=compiling.file, line=compiling.line, column=1,
            evidence={"flag": compiling.name, "context": masking.context, "masking_file": masking.file,
                      "masking_line": masking.line},
        ))
    if states[Hazard.DEADLOCK] == PRESENT:
        findings.append(_deadlock_finding(layout))
    settings = layout.compile_settings
    if settings.per_thread:
        findings.append(rules.COMPILE_SETTINGS_PER_THREAD.finding(
            "an assigned compile setting lives in the assigning thread's ContextVar (ConfigModule.__setattr__, "
            f"{settings.file}:{settings.write_line}): " + "; ".join(settings.to_dict()["consequences"]),
            path=settings.file, line=settings.write_line, column=1,
            evidence={"storage": settings.storage, "contextvar_line": settings.contextvar_line,
                      "write_line": settings.write_line},
        ))
    return findings


def _deadlock_finding(layout: Layout) -> Finding:
    backward = layout.backward
    lock, lazy, holder = backward.lock, backward.lazy, backward.holder
    assert lock is not None and lazy is not None and holder is not None  # what makes the hazard present
    path = " -> ".join(backward.path)
    message = (f"the backward compile ({path}) takes compile_lock here and runs lazily at the first backward "
               f"({lazy.function}, {lazy.file}:{lazy.line}), on the autograd device thread for GPU tensors, while "
               f"a Dynamo compile holding the same lock ({holder.file}:{holder.line}) can wait for that thread")
    option = backward.non_lazy_option
    message += (f"; torch._functorch.config.force_non_lazy_backward_lowering ({option.file}:{option.line}) "
                "compiles it with the forward instead" if option else
                "; this release has no force_non_lazy_backward_lowering switch")
    return rules.BACKWARD_COMPILE_TAKES_COMPILE_LOCK.finding(
        message, path=lock.file, line=lock.line, column=1,
        evidence={"path": list(backward.path), "lazy_file": lazy.file, "lazy_line": lazy.line,
                  "holder_file": holder.file, "holder_line": holder.line,
                  "non_lazy_backward_available": backward.non_lazy_available},
    )


def state_findings(facts: Mapping) -> List[Finding]:
    """Findings from guards facts (the live state and probe outcomes); absent keys mean "not known"."""
    findings = []
    if facts.get("fx_flag_now") is True:
        findings.append(rules.FX_FLAG_STUCK.finding(evidence={"fx_flag_now": True}))
    config = facts.get("config") or {}
    changed = {name: config[name] for name, default in CONFIG_DEFAULTS.items()
               if config.get(name) is not None and config[name] != default}
    if changed:
        shown = ", ".join(f"{name}={value}" for name, value in changed.items())
        findings.append(rules.NESTED_FX_TRACE_ERROR_DISABLED.finding(
            f"torch._dynamo.config has {shown}: the FX race now runs the uncompiled function instead of raising",
            evidence=changed,
        ))
    findings += _cold_cache(facts)
    details = facts.get("probe_details") or {}
    for probe in PROBES:
        name = probe.name
        if (facts.get("probes") or {}).get(name) == ProbeOutcome.REPRODUCED:
            detail = (details.get(name) or {}).get("detail")
            findings.append(probe.rule.finding(
                evidence={"probe": name, "detail": detail} if detail else {"probe": name}))
    return findings


def _cold_cache(facts: Mapping) -> List[Finding]:
    cache = facts.get("compile_cache")
    disabled = (facts.get("env") or {}).get("TORCHINDUCTOR_FORCE_DISABLE_CACHES") not in (None, "", "0")
    if disabled:
        return [rules.COMPILE_CACHE_COLD.finding(
            "TORCHINDUCTOR_FORCE_DISABLE_CACHES is set: every compile traces from scratch",
            evidence={"TORCHINDUCTOR_FORCE_DISABLE_CACHES": facts["env"]["TORCHINDUCTOR_FORCE_DISABLE_CACHES"]},
        )]
    if not cache or (cache.get("exists") and cache.get("entries")):
        return []
    state = "does not exist" if not cache.get("exists") else "is empty"
    return [rules.COMPILE_CACHE_COLD.finding(
        f"the inductor cache {cache.get('dir')} {state}: first steps will trace with make_fx",
        evidence={"dir": cache.get("dir"), "exists": cache.get("exists"), "entries": cache.get("entries")},
    )]


def findings_for_example(example_format: str, text: str) -> List[Finding]:
    """What a DFD6xx rule example yields: `torch-layout` bundles or `guards-state` JSON."""
    if example_format == "torch-layout":
        return layout_findings(read_layout_text(text))
    if example_format == "guards-state":
        return state_findings(json.loads(text))
    raise UsageError(f"not a guards example format: {example_format!r}")


def layout_example_findings(text: str) -> List[Finding]:
    """A torch-layout rule example's findings (rule_examples.py EXAMPLE_RUNNERS)."""
    return findings_for_example("torch-layout", text)


def state_example_findings(text: str) -> List[Finding]:
    """A guards-state rule example's findings (rule_examples.py EXAMPLE_RUNNERS)."""
    return findings_for_example("guards-state", text)
