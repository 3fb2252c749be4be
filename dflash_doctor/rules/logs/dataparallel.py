"""DFD519: a replica of nn.DataParallel failed in its thread and DataParallel raised it again in the caller.

Before the other fatal kinds (precedence.py): the replica's failure holds the error inside the replica (an OOM,
Dynamo's error) in its message, and the replica is the cause."""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence

from dflash_doctor.dataparallel import FIXES as DATAPARALLEL_FIXES
from dflash_doctor.findings import Finding, Severity
from dflash_doctor.rules.logs.model import declare
from dflash_doctor.rules.logs.shared import fix_step
from dflash_doctor.rules.registry import Rule


# torch/_utils.py ExceptionWrapper.reraise: 'Caught <Error> in replica N on device D.' then 'Original Traceback
# (most recent call last):' and the replica's traceback as text, raised again in the thread that called
# DataParallel (torch/nn/parallel/parallel_apply.py runs each replica's forward in a thread of its own).
_REPLICA = re.compile(r"Caught (?P<error>[\w.]+) in replica (?P<replica>\d+) on device (?P<device>-?\d+)")
_INNER = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt))(?::\s?(?P<msg>.*))?$",
                    re.MULTILINE)


def _replica_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    inner = [m for m in _INNER.finditer(text[match.end():])]
    last = inner[-1] if inner else None
    return {"replica": int(match.group("replica")), "gpu": int(match.group("device")),
            "error": match.group("error"), "inner": last.group("type") if last else match.group("error"),
            "inner_message": (last.group("msg") or "")[:200] if last else ""}


def _replica_message(details: Dict[str, Any]) -> str:
    said = f": {details['inner']}" + (f": {details['inner_message']}" if details["inner_message"] else "")
    return (f"nn.DataParallel's replica {details['replica']} (a thread, on device {details['gpu']}) failed{said}; "
            "DataParallel raised it again in the caller")


def _replica_steps(found: Sequence[Finding], threads: Dict[str, dict], count: int) -> Optional[List[str]]:
    # dataparallel.FIXES, best first, with each one's caveat: the same words DFD204 and DFD707 give
    return [f"{fix.name}: {fix.api} ({fix.caveat})" for fix in DATAPARALLEL_FIXES] + [
            "dflash-doctor scan <trainer dir>: where a compiled module is handed to DataParallel or parallel_apply",
            fix_step(LOG_DATAPARALLEL_REPLICA)]


LOG_DATAPARALLEL_REPLICA = declare(Rule(
    code="DFD519",
    name="log-dataparallel-replica-failed",
    severity=Severity.ERROR,
    summary="a replica of nn.DataParallel failed in its thread and DataParallel raised it again in the caller",
    rationale=(
        "nn.DataParallel (and the Hugging Face Trainer on a machine with several GPUs started without a launcher, "
        "which wraps the model in it) runs each replica's forward in a thread of its own (parallel_apply), and "
        "re-raises a replica's exception in the caller as 'Caught <Error> in replica N on device D.' followed "
        "by 'Original Traceback' and the replica's traceback as text (torch/_utils.py ExceptionWrapper). So a "
        "compiled module inside DataParallel is compiled and called from several threads at once. Measured on "
        "one H100 with torch 2.11 (docs/races.md, 'What logs reads from threads'): "
        "nn.DataParallel(torch.compile(model), "
        "device_ids=[0, 0, 0]) failed at its first step with 'Caught InternalTorchDynamoError in replica 0 on "
        "device 0' (a RecursionError in Dynamo's guard building), while torch.compile(nn.DataParallel(model)) "
        "ran; public reports show the FX-tracing RuntimeError the same way. The caller's traceback is not where "
        "the failure is: the replica's is."
    ),
    fix="Compile outside the DataParallel (torch.compile(nn.DataParallel(model))), or run one process per GPU with "
        "torchrun or accelerate launch instead of DataParallel's threads.",
    example_format="log",
    bad=(
        "Traceback (most recent call last):\n"
        '  File "/srv/cls/train.py", line 88, in <module>\n'
        "    logits = model(batch)\n"
        '  File "/opt/venv/lib/python3.11/site-packages/torch/nn/parallel/data_parallel.py", line 194, in forward\n'
        "    outputs = self.parallel_apply(replicas, inputs, module_kwargs)\n"
        '  File "/opt/venv/lib/python3.11/site-packages/torch/_utils.py", line 750, in reraise\n'
        "    raise exception\n"
        "torch._dynamo.exc.InternalTorchDynamoError: Caught InternalTorchDynamoError in replica 1 on device 1.\n"
        "Original Traceback (most recent call last):\n"
        '  File "/opt/venv/lib/python3.11/site-packages/torch/nn/parallel/parallel_apply.py", line 99, in _worker\n'
        "    output = module(*input, **kwargs)\n"
        "RecursionError: maximum recursion depth exceeded while calling a Python object\n"
    ),
    good=(
        "step 10 loss 2.31 (DataParallel over 2 GPUs)\n"
    ),
), triggers=("Caught ",), fatal=True, pattern=_REPLICA, details=_replica_details, describe=_replica_message,
    next_steps=_replica_steps, worker_of=lambda d: f"replica {d['replica']}")
