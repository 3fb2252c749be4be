"""The texts torch, Python's threading and NCCL actually print, as regexes. One place to update per release.

Sources: torch/_dynamo/eval_frame.py (the FX guard), torch/nn/attention/flex_attention.py (_warn_once
'flex_attention_performance'), torch/_dynamo/convert_frame.py ('torch._dynamo hit config.%s (%s)'),
c10/cuda/CUDACachingAllocator.cpp (OOM text, old and new forms), ProcessGroupNCCL.cpp (watchdog),
Lib/threading.py (excepthook: 'Exception in thread NAME:').
"""
from __future__ import annotations

import re

# A cheap bytes pre-filter: a line outside a traceback block is decoded and examined only if this matches.
TRIGGER = re.compile(
    rb"tok(?:ens)?/s|step|Step|STEP|Exception|Error|Traceback|Watchdog|watchdog|NCCL|"
    rb"flex_attention called|hit config\.|out of memory|function: "
)

THREAD_EXCEPTION = re.compile(r"^Exception in thread (?P<thread>.+?):\s*$")
TRACEBACK_START = re.compile(r"^\s*Traceback \(most recent call last\):\s*$")
CHAIN = re.compile(r"^(During handling of the above exception|The above exception was the direct cause)")
FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<func>\S+)')
# The last line of a traceback: a (possibly module-qualified) exception type, optionally ': message'.
EXCEPTION_LINE = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)+[A-Za-z_]\w*|[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Iteration|Warning|"
    r"Failure|Failed|Timeout))(?::\s?(?P<message>.*))?$"
)

FX_TRACE_RACE = re.compile(r"using FX to symbolically trace a dynamo-optimized function")
CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError")
OOM_GPU = re.compile(r"GPU (?P<gpu>\d+) has a total capacity|\(GPU (?P<old>\d+);")
OOM_TRIED = re.compile(r"Tried to allocate (?P<size>[\d.]+ [KMGT]?i?B)")
NCCL_TIMEOUT = re.compile(
    r"(?:\[Rank (?P<rank>\d+)\] )?Watchdog caught collective operation timeout: WorkNCCL\((?P<work>.*?)\) "
    r"ran for (?P<ran>\d+) milliseconds"
)
NCCL_STUCK = re.compile(r"(?:\[(?:PG \S+ )?Rank (?P<rank>\d+)\] )?.*watchdog got stuck for (?P<secs>\d+) seconds")
NCCL_EXCEPTION = re.compile(r"DistBackendError|NCCL (?:error|timeout)|ProcessGroupNCCL.*[Tt]imeout")
DENSE_FALLBACK_WARNING = re.compile(r"flex_attention called without torch\.compile\(\)")
DENSE_FALLBACK_FRAMES = ("sdpa_dense", "math_attention", "sdpa_dense_backward")
RECOMPILE_LIMIT = re.compile(
    r"torch\._dynamo hit config\.(?P<limit>(?:accumulated_)?(?:recompile_limit|cache_size_limit)) \((?P<value>\d+)\)"
)
RECOMPILE_FUNCTION = re.compile(r"function: '(?P<function>[^']+)' \((?P<where>[^)]*)\)")

THROUGHPUT = re.compile(r"(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[kKmM]?)\s*tok(?:ens)?/s")
STEP = re.compile(r"\bstep\s*[=:]?\s*(?P<step>\d+)", re.IGNORECASE)
GPU_MENTION = re.compile(r"cuda:(?P<gpu>\d+)")

# Which thread a line belongs to: thread=NAME / worker=NAME, [NAME-N], NAME-N, [rankN]. Leftmost match wins.
DEFAULT_THREAD_PATTERN = (
    r"\b(?:thread|worker)[=:]\s*(?P<thread>[\w.-]+)"
    r"|\[(?P<rank>rank\d+)\]"
    r"|\b(?P<named>[A-Za-z][A-Za-z_]*-\d+)\b"
)

UNIT = {"": 1.0, "k": 1e3, "m": 1e6}


def tok_per_s(match: "re.Match") -> float:
    return float(match.group("value")) * UNIT[match.group("unit").lower()]
