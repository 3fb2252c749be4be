"""Findings (DFD6xx) for the hazards a layout or a set of guards facts shows. Plain functions of their input, so
the rules' examples (stand-in layouts, JSON state) run through exactly the code the command uses.
"""
from __future__ import annotations

import json
from typing import List, Mapping

from dflash_doctor.errors import UsageError
from dflash_doctor.findings import Finding
from dflash_doctor.guards.layout import MODULE_GLOBAL, Layout, read_layout_text
from dflash_doctor.guards.probes import REPRODUCED
from dflash_doctor.guards.state import CONFIG_DEFAULTS
from dflash_doctor.rules import guards as rules

_PROBE_RULES = (
    ("cross_thread_leak", rules.PROBE_CROSS_THREAD_LEAK),
    ("stuck_flag", rules.PROBE_STUCK_FLAG),
    ("is_compiling_leak", rules.PROBE_IS_COMPILING_LEAK),
)


def layout_findings(layout: Layout) -> List[Finding]:
    findings = []
    flag, guard = layout.fx_flag, layout.guard
    if layout.fx_flag_storage == MODULE_GLOBAL:
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
    compiling = layout.compiling_flag
    if layout.masked_during_compile and compiling.storage == MODULE_GLOBAL:
        masking = layout.masking
        findings.append(rules.COMPILING_FLAG_PROCESS_GLOBAL.finding(
            f"{compiling.name} is a module global that {masking.function} ({masking.file}:{masking.line}) holds "
            "True for the whole compile: every thread sees torch.compiler.is_compiling() while any thread compiles",
            path=compiling.file, line=compiling.line, column=1,
            evidence={"flag": compiling.name, "context": masking.context, "masking_file": masking.file,
                      "masking_line": masking.line},
        ))
    return findings


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
    for name, rule in _PROBE_RULES:
        if (facts.get("probes") or {}).get(name) == REPRODUCED:
            detail = (details.get(name) or {}).get("detail")
            findings.append(rule.finding(evidence={"probe": name, "detail": detail} if detail else {"probe": name}))
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
