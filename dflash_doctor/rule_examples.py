"""Every rule example format's runner: the function that turns a rule's bad or good example into findings through
exactly the code its command runs (tests/test_rule_examples.py runs every rule's examples with it).

It imports a runner from each domain, so it stands above them all; the rule registry below it names the formats
only (rules/registry.py EXAMPLE_FORMATS), and importing this module checks that the two name the same formats.
Nothing that `cli.py` imports imports this module.
"""
from __future__ import annotations

from typing import Callable, Dict, List

from dflash_doctor.findings import Finding
from dflash_doctor.gpus.examples import example_findings as gpus_example
from dflash_doctor.guards.hazard_findings import layout_example_findings, state_example_findings
from dflash_doctor.logs.examples import example_findings as logs_example
from dflash_doctor.reference.findings import example_findings as pipeline_example
from dflash_doctor.repro.findings import example_findings as repro_example
from dflash_doctor.rules.registry import EXAMPLE_FORMATS, Rule
from dflash_doctor.scan.engine import example_findings as scan_example
from dflash_doctor.supervise.findings import example_findings as live_example

EXAMPLE_RUNNERS: Dict[str, Callable[[str], List[Finding]]] = {
    "python": scan_example,  # a source file with `# DFDxxx` on offending lines
    "nvidia-smi-csv": gpus_example,  # a snapshot, options as comments
    "log": logs_example,  # a log excerpt
    "torch-layout": layout_example_findings,  # stand-in torch sources
    "guards-state": state_example_findings,  # guards facts (JSON)
    "repro-facts": repro_example,  # a repro facts document (JSON)
    "pipeline-facts": pipeline_example,  # a pipeline facts document (JSON)
    "live-facts": live_example,  # run/attach per-process records (JSON)
}
if tuple(EXAMPLE_RUNNERS) != EXAMPLE_FORMATS:
    raise RuntimeError(f"example formats {EXAMPLE_FORMATS} and their runners {tuple(EXAMPLE_RUNNERS)} differ")


def example_findings(rule: Rule, text: str) -> List[Finding]:
    """The findings `text`, written in `rule`'s example format, yields (its bad or good example)."""
    return EXAMPLE_RUNNERS[rule.example_format](text)
