"""What to do next about a gpus report: one line per kind of finding, from the rule registry."""
from __future__ import annotations

from typing import List, Sequence

from dflash_doctor.findings import Finding
from dflash_doctor.rules import lookup
from dflash_doctor.rules.gpus import IDLE_BESIDE_PEERS


def next_steps(findings: Sequence[Finding], source: str = "snapshot.csv") -> List[str]:
    steps: List[str] = []
    codes = []
    for finding in sorted(findings, key=lambda f: -f.severity.rank):
        if finding.code not in codes:
            codes.append(finding.code)
    for code in codes:
        if code in IDLE_BESIDE_PEERS:
            steps.append(f"dflash-doctor status --log train.log --from {source} --roles ROLE=GPUS: which worker "
                         "died on it and why")
        else:
            rule = lookup(code)
            steps.append(f"{code}: {rule.fix}" if rule is not None and rule.fix else f"dflash-doctor explain {code}")
    return list(dict.fromkeys(steps))
