"""What several log families share: a rule's fix as a next step, the mitigation registry's recommendation, the GPU
a message names, DeepSpeed's '--local_rank=N'."""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence

from dflash_doctor.findings import Finding
from dflash_doctor.hazards import Hazard
from dflash_doctor.rules.logs.model import DECLARED, NextSteps
from dflash_doctor.rules.registry import Rule


def fix_step(rule: Rule) -> str:
    return f"{rule.code}: {rule.fix}" if rule.fix else f"dflash-doctor explain {rule.code}"


def fix_line(hazards: Sequence[Hazard]) -> List[str]:
    """The mitigation registry's first complete recommendation for `hazards`, as one line (none when it has none)."""
    from dflash_doctor.mitigations import recommend

    recommended = recommend(set(hazards))
    if not recommended:
        return []
    best = recommended[0]
    return [f"fix ({best.label}): " + "; ".join(best.api)]


def scan_for_uncompiled(code: str) -> NextSteps:
    """Scan for flex_attention reached uncompiled, then the fix of the rule `code` (declared by the time it runs)."""

    def steps(found: Sequence[Finding], threads: Dict[str, dict], count: int) -> Optional[List[str]]:
        return ["dflash-doctor scan <trainer dir>: flex_attention reached uncompiled (DFD202) or the FX error "
                "silenced (DFD301)", fix_step(DECLARED[code].rule)]
    return steps


_GPU_MENTION = re.compile(
    r"\bGPU (?P<a>\d+) has a total capac|\(GPU (?P<b>\d+);|\bcuda:(?P<c>\d+)|\bon (?:device|GPU) (?P<d>\d+)\b"
    r"|\bdevice[ =](?P<e>\d+)\b"
)


def gpu_in(text: str) -> Optional[int]:
    """The GPU a message names ('GPU 7 has a total capacity', '(GPU 6; ...)', 'cuda:3', 'on device 0')."""
    match = _GPU_MENTION.search(text)
    if match is None:
        return None
    return int(next(g for g in match.groups() if g is not None))


def gpu_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    gpu = gpu_in(text)
    return {} if gpu is None else {"gpu": gpu}


def on_gpu(details: Dict[str, Any]) -> str:
    return f" on GPU {details['gpu']}" if details.get("gpu") is not None else ""


# DeepSpeed's launcher names the rank in the command it prints: "[launch.py:321:sigkill_handler] ['python', '-u',
# 'train.py', '--local_rank=1', ...] exits with return code = -9"
DS_LOCAL_RANK = re.compile(r"'--local_rank=(\d+)'")
