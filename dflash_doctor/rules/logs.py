"""Training-log rules (DFD5xx): what `dflash-doctor logs` finds while streaming a log.

Each rule is declared once, here, as a `LogRule`: its registry metadata (code, name, rationale, fix, bad/good
examples), the literal words the block prefilter looks for (`triggers`: a line holding none of them is never
parsed for the rule), and the pattern that recognises it on a line or in an exception's 'Type: message'. The
scanner (dflash_doctor/logs/) derives its prefilter and its classification from `LOG_RULES`, so adding a fatal
kind is a change in this module alone, and its examples are its tests (tests/logs/ runs every one).

Examples use example_format "log": plain log excerpts, scanned by `dflash_doctor.logs.examples.run_example`.
The texts are what torch, Python, NCCL, Triton and torchrun print (torch/_dynamo/eval_frame.py,
c10/cuda/CUDACachingAllocator.cpp, ProcessGroupNCCL.cpp, triton/runtime/errors.py,
torch/distributed/elastic/multiprocessing/errors/__init__.py, Lib/threading.py), written here as stand-ins.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from dflash_doctor.dataparallel import FIXES as DATAPARALLEL_FIXES
from dflash_doctor.findings import Finding, Severity
from dflash_doctor.hazards import Hazard
from dflash_doctor.mitigations import fix_text
from dflash_doctor.rules.registry import Rule, register

Details = Callable[["re.Match[str]", str], Dict[str, Any]]
# What to do next about a rule's findings: (its findings, most severe first; the threads of the facts; how many
# threads a repro should start) -> steps, or None for the rule's fix (logs/next_steps.py).
NextSteps = Callable[[Sequence[Finding], Dict[str, dict], int], Optional[List[str]]]

UNNAMED = "main"  # the worker of a line that names none
ABORT_LINES = 20  # the C++ terminate lines that follow a watchdog abort within this many lines are its


def _no_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    return {}


def _per_worker(worker: str, details: Dict[str, Any]) -> tuple:
    return (worker,)


def _rule_severity(details: Dict[str, Any]) -> Optional[Severity]:
    return None


@dataclass
class HeldLine:
    """A matched line whose finding waits for what follows it, or for the end of the log."""

    worker: str
    lineno: int
    body: str = ""
    details: Dict[str, Any] = field(default_factory=dict)


@dataclass
class HeldRecompile(HeldLine):
    """The recompile-limit warning, waiting up to RECOMPILE_LOOKAHEAD lines for its 'function:' line."""

    function: Optional[str] = None
    lines_seen: int = 0


@dataclass
class LineMemory:
    """What the rules' line hooks remember from one line to the next; the scanner reports the held lines when they
    are due (a later line, ABORT_LINES on, the end of the log)."""

    last_timeout: int = -ABORT_LINES - 1  # line of the last collective timeout
    last_abort: Optional[HeldLine] = None  # the last watchdog-abort line that named its worker
    held_abort: Optional[HeldLine] = None  # a 'terminate called' line waiting for its rank
    launcher_cut: Optional[HeldLine] = None  # DeepSpeed's launcher line, its return code cut off
    held_recompile: Optional[HeldRecompile] = None
    pyspy_header: Optional[HeldLine] = None  # py-spy's 'Process N:' line with no thread after it (yet)
    fatal_error_line: Optional[int] = None  # 'Fatal Python error': a faulthandler dump after it is the crash's
    limit_set: Optional[HeldLine] = None  # the last line that set a recompile limit ('recompile_limit = 64')


@dataclass(frozen=True)
class RuleLine:
    """A line that one rule's pattern matched, handed to that rule's hook."""

    body: str
    lineno: int
    stream: Optional[str]  # the worker its prefix names, if any
    worker: str
    match: "re.Match[str]"


class RuleScanner(Protocol):
    """What a rule's hook may use of the scanner reading the line (dflash_doctor/logs/scanner.py)."""

    memory: LineMemory

    def line_before(self) -> Optional[str]: ...

    def start_dump(self, lineno: int, stream: Optional[str], text: str) -> None: ...

    def report(self, rule: Rule, key: tuple, message: str, lineno: int, evidence: Dict[str, Any]) -> None: ...

    def is_dead(self, worker: str) -> bool: ...


# A rule's own handling of its line, before the scanner reports the usual finding (and the death, for a fatal rule):
# `on_match` takes the line as it is (no finding of the usual kind follows); `on_line` sees it with its details and
# its worker resolved, and returns the worker the finding goes to, or None when it held or dropped the line.
MatchHook = Callable[[RuleScanner, RuleLine], None]
LineHook = Callable[[RuleScanner, RuleLine, Dict[str, Any]], Optional[str]]


@dataclass(frozen=True)
class LogRule:
    """How the log scanner recognises one DFD5xx rule.

    `fatal`: a match inside a traceback's exception, or on a bare exception line, names why a worker died (the
    rules are tried in LOG_RULES order, so a narrower kind declared first wins: the jit.trace message before the
    FX race, Triton's OutOfResources before CUDA OOM). `describe` turns the details into the finding's message
    after 'WORKER: '. `line_is_death`: the matched line alone means the process is gone (no exception line needed),
    of `death_kind`. `finding_key`: findings with the same key are one finding (repeats are counted).
    `records_only`: judged on warning and error records only, never on a glog INFO record. `explains_cut_traceback`:
    a traceback cut before its exception shortly after this rule's finding for a worker is that death's."""

    rule: Rule
    triggers: Tuple[str, ...] = ()
    pattern: Optional["re.Pattern[str]"] = None
    fatal: bool = False
    details: Details = _no_details
    describe: Optional[Callable[[Dict[str, Any]], str]] = None
    on_match: Optional[MatchHook] = None
    on_line: Optional[LineHook] = None
    line_is_death: bool = False
    death_kind: str = "process"
    finding_key: Callable[[str, Dict[str, Any]], tuple] = _per_worker
    severity_of: Callable[[Dict[str, Any]], Optional[Severity]] = _rule_severity
    records_only: bool = False
    explains_cut_traceback: bool = True
    # Whether the rule explains a traceback whose exception it matched: (the match, whether the traceback is a
    # thread's, its frames' functions outermost first). By default every match does.
    explains_block: Optional[Callable[["re.Match[str]", bool, Tuple[str, ...]], bool]] = None
    next_steps: Optional[NextSteps] = None  # what to run or read next; by default the rule's fix
    # The worker a cause names itself, whatever the line's prefix says (a DataParallel replica: 'replica 0').
    worker_of: Optional[Callable[[Dict[str, Any]], Optional[str]]] = None

    def message(self, details: Dict[str, Any]) -> str:
        return self.describe(details) if self.describe is not None else self.rule.summary


LOG_RULES: Dict[str, LogRule] = {}  # by code, in declaration order (= classification precedence)


def declare(rule: Rule, **matcher: Any) -> Rule:
    """Register `rule` and how the scanner finds it."""
    if rule.example_format != "log":
        raise ValueError(f"{rule.code}: log rules are written as log excerpts")
    LOG_RULES[rule.code] = LogRule(register(rule), **matcher)
    return rule


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


def _workers(findings: Sequence[Finding]) -> List[str]:
    return sorted({str(f.evidence.get("thread")) for f in findings if f.evidence.get("thread")})


def _stopped_first(threads: Dict[str, dict]) -> Optional[str]:
    ranked = [(t["last_step"], name) for name, t in threads.items()
              if t.get("last_step") is not None and name != UNNAMED]
    if len(ranked) < 2:
        return None
    step, name = min(ranked)
    return f"{name}, last step {step}"


def _after_a_timeout(found: Sequence[Finding], threads: Dict[str, dict], count: int) -> Optional[List[str]]:
    if not any(f.evidence.get("inner_cause") in (None, "collective timeout") for f in found):
        return None
    first = _stopped_first(threads)
    where = f" ({first})" if first else ""
    return [f"a collective timed out: find the rank that stopped first{where} and read its own error or stack; the "
            "timeouts of the others follow from it"]


def _scan_for_uncompiled(code: str) -> NextSteps:
    def steps(found: Sequence[Finding], threads: Dict[str, dict], count: int) -> Optional[List[str]]:
        return ["dflash-doctor scan <trainer dir>: flex_attention reached uncompiled (DFD202) or the FX error "
                "silenced (DFD301)", fix_step(LOG_RULES[code].rule)]
    return steps


def trigger_words() -> Tuple[str, ...]:
    return tuple(word for entry in LOG_RULES.values() for word in entry.triggers)


# -- details shared by several rules ---------------------------------------------------------------------------

_GPU_MENTION = re.compile(
    r"\bGPU (?P<a>\d+) has a total capac|\(GPU (?P<b>\d+);|\bcuda:(?P<c>\d+)|\bon (?:device|GPU) (?P<d>\d+)\b"
    r"|\bdevice[ =](?P<e>\d+)\b"
)
_RANK_MENTION = re.compile(r"\[(?:PG [^\]]{0,120}?)?Rank (?P<rank>\d+)(?:\]|\s*$)")  # (a pasted line may be cut after the rank)


def gpu_in(text: str) -> Optional[int]:
    """The GPU a message names ('GPU 7 has a total capacity', '(GPU 6; ...)', 'cuda:3', 'on device 0')."""
    match = _GPU_MENTION.search(text)
    if match is None:
        return None
    return int(next(g for g in match.groups() if g is not None))


def _gpu_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    gpu = gpu_in(text)
    return {} if gpu is None else {"gpu": gpu}


def _on_gpu(details: Dict[str, Any]) -> str:
    return f" on GPU {details['gpu']}" if details.get("gpu") is not None else ""


# -- fatal kinds: each names why a worker died ----------------------------------------------------------------

# Declared first: a line of the tool's own report quotes other rules' words (a DFD905 line holds the NameError), and
# a DataParallel replica's failure holds the error inside the replica (an OOM, Dynamo's error) in its message.

# `dflash-doctor run`'s lines, live ('dflash-doctor: DFD903 live-lock-deadlock: pid 4242: ...') and in its report
# ('train.py:21:1: DFD903 live-lock-deadlock pid 4242: ...', or without a location): render/text.py's format.
_DOCTOR_LINE = re.compile(r"^(?:dflash-doctor: |(?P<path>\S.*?):(?P<line>\d+):\d+: )?(?P<code>DFD\d{3}) "
                          r"(?P<name>[a-z][a-z0-9]*(?:-[a-z0-9]+)+):? (?P<message>.+)$")
_DOCTOR_PID = re.compile(r"\bpid (?P<pid>\d+)")
_DOCTOR_THREADS = re.compile(r"^(?:(?:rank \d+ \()?pid \d+\)?: threads (?P<threads>[\w.-]+(?:, [\w.-]+)*)"
                             r"|(?P<thread>[\w.-]+) \((?:rank \d+ \()?pid \d+)")


def _doctor_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    message = match.group("message")
    pid = _DOCTOR_PID.search(message)
    named = _DOCTOR_THREADS.search(message)
    threads = (named.group("threads").split(", ") if named and named.group("threads")
               else [named.group("thread")] if named else [])
    return {"reported_code": match.group("code"), "reported_name": match.group("name"),
            "reported_message": message[:400], "pid": int(pid.group("pid")) if pid else None,
            "threads": threads, "path": match.group("path"),
            "reported_line": int(match.group("line")) if match.group("line") else None}


def _doctor_severity(details: Dict[str, Any]) -> Optional[Severity]:
    from dflash_doctor.rules.catalog import lookup

    reported = lookup(details["reported_code"])
    return reported.severity if reported is not None else None


def _doctor_steps(found: Sequence[Finding], threads: Dict[str, dict], count: int) -> Optional[List[str]]:
    codes = sorted({str(f.evidence.get("reported_code")) for f in found})
    return [f"dflash-doctor explain {code}: what the run found and its fix" for code in codes] + [
        "the run's JSON report (`run -f json -o run.json`) keeps the stacks and the chain; rerun the same command "
        "under `dflash-doctor run --fix ...` to prove a fix"]


LOG_DOCTOR_FINDING = declare(Rule(
    code="DFD522",
    name="log-doctor-finding",
    severity=Severity.ERROR,
    summary="the log holds dflash-doctor's own finding (a saved `run` or `attach` output): read back as such",
    rationale=(
        "`dflash-doctor run` writes its findings to stderr as it finds them ('dflash-doctor: DFD903 "
        "live-lock-deadlock: pid 4242: threads loader, trainer wait on each other's locks') and again in its "
        "report ('train.py:21:1: DFD903 live-lock-deadlock pid 4242: ...'). A saved stderr handed to `logs` is the "
        "best evidence a log can hold: the run watched the threads. Each finding is reported once, with the "
        "run's code, its severity and the threads it names; its words are not read again by the log rules (a "
        "DFD905 line quotes the NameError it explains)."
    ),
    fix="Read the run's finding: `dflash-doctor explain CODE` for its rationale and fix.",
    example_format="log",
    bad=(
        "dflash-doctor: DFD903 live-lock-deadlock: pid 4242: threads loader, trainer wait on each other's locks. "
        "Next: Take the locks in one global order.\n"
        "run python pipeline.py  fixes: none; cache: as-is\n"
        "pipeline.py:21:1: DFD903 live-lock-deadlock pid 4242: threads loader, trainer wait on each other's locks. "
        "Next: Take the locks in one global order.\n"
        "run: 1 error (exit 137)\n"
    ),
    good=(
        "run python pipeline.py  fixes: none; cache: as-is\n"
        "run: no findings (exit 0)\n"
    ),
    # (trigger words with a byte the prefilter already anchors: the names of DFD901-DFD905 hold 'live-' or 'run-fx-',
    # a DFD906 line quotes the thread's 'SomeError:')
), triggers=("live-", "run-fx-", "Error:"), pattern=_DOCTOR_LINE, details=_doctor_details,
    describe=lambda d: f"dflash-doctor's {d['reported_code']} {d['reported_name']}: {d['reported_message']}",
    finding_key=lambda worker, d: (d["reported_code"], d["pid"], tuple(d["threads"])),
    severity_of=_doctor_severity, explains_cut_traceback=False, next_steps=_doctor_steps,
    worker_of=lambda d: d["threads"][0] if d["threads"] else None)

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
            fix_step(LOG_RULES["DFD519"].rule)]


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


LOG_JIT_TRACE_COMPILED = declare(Rule(
    code="DFD509",
    name="log-jit-trace-compiled",
    severity=Severity.ERROR,
    summary="torch.jit.trace reached a torch.compile'd function (not a thread race)",
    rationale=(
        "torch.compile's wrapper refuses to run under torch.jit.trace: 'Detected that you are using FX to "
        "torch.jit.trace a dynamo-optimized function'. The message starts like the FX-tracing race (DFD501) but "
        "the cause is deterministic: the model being jit-traced calls compiled code. It fails on every run, in one "
        "thread as in many, and no lock or warm-up changes that."
    ),
    fix=(
        "Trace or export the uncompiled module (keep the nn.Module before torch.compile and trace that), or use "
        "torch.export / torch.compile alone instead of torch.jit.trace on compiled code."
    ),
    example_format="log",
    bad=(
        "Traceback (most recent call last):\n"
        '  File "/workspace/export.py", line 41, in <module>\n'
        "    traced = torch.jit.trace(model, example)\n"
        '  File "/usr/lib/python3.11/site-packages/torch/_dynamo/eval_frame.py", line 1129, in compile_wrapper\n'
        "    raise RuntimeError(\n"
        "RuntimeError: Detected that you are using FX to torch.jit.trace a dynamo-optimized function. This is not "
        "supported at the moment.\n"
    ),
    good=(
        "INFO export: traced the eager module, wrote drafter.pt\n"
    ),
), triggers=("FX to torch.jit.trace",), fatal=True,
    pattern=re.compile(r"using FX to torch\.jit\.trace a dynamo-optimized function"),
    describe=lambda d: "torch.jit.trace called a torch.compile'd function (deterministic, not a thread race)")

LOG_FX_TRACE_RACE = declare(Rule(
    code="DFD501",
    name="log-fx-trace-race",
    severity=Severity.ERROR,
    summary="a worker died of the FX-tracing race: 'Detected that you are using FX to symbolically trace a "
    "dynamo-optimized function'",
    rationale=(
        "torch.compile'd functions check a process-global FX-tracing flag on every call. While one thread "
        "compiles (make_fx sets the flag), another thread calling compiled code raises this RuntimeError, and "
        "with the thread's loop gone its GPU keeps its memory at 0 % utilization. It is a race, not a bug in the "
        "traced function: a warm compile cache hides it, deleting the cache brings it back."
    ),
    fix=(
        "Warm every shape in one thread before starting workers, or serialise compiled steps; `dflash-doctor "
        "guards` shows the installed torch's guard, `dflash-doctor repro --matrix` which mitigation works here."
    ),
    example_format="log",
    bad=(
        "Exception in thread drafter-0:\n"
        "Traceback (most recent call last):\n"
        '  File "/workspace/train.py", line 640, in run\n'
        "    out = flex(q, k, v, block_mask=mask)\n"
        '  File "/usr/lib/python3.12/site-packages/torch/_dynamo/eval_frame.py", line 843, in compile_wrapper\n'
        "    raise RuntimeError(\n"
        "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function. "
        "This is not supported at the moment.\n"
    ),
    good=(
        "[drafter-0] step=120 loss=2.41 7.2 Ktok/s\n"
        "[drafter-1] step=120 loss=2.43 7.1 Ktok/s\n"
    ),
), triggers=("FX to symbolically",), fatal=True,
    next_steps=lambda found, threads, count: [
        "dflash-doctor guards: does the installed torch check a process-global FX-tracing flag on every compiled "
        "call?",
        f"dflash-doctor repro --threads {count} --matrix: which mitigation removes the race on this machine",
        "dflash-doctor scan <trainer dir>: the compiled calls reached from threads (DFD201)"]
    + fix_line((Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG, Hazard.DEADLOCK)),
    pattern=re.compile(r"using FX to symbolically trace a dynamo-optimized function"),
    details=_gpu_details,
    describe=lambda d: "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized "
    "function (the FX-tracing race between threads)")

# the NameError as raised, or inside the error that wraps it: Dynamo's fake-tensor run of a compiled call that met
# the patches ("TorchRuntimeError: RuntimeError when making fake tensor call ... got NameError('module is not
# installed as a submodule')", seen on the H200, docs/gpu-results.md)
_PATCHER_RACE = re.compile(r"(?P<submodule>NameError(?:: |\(['\"])module is not installed as a submodule)"
                           r"|(?P<patcher>CURRENT_PATCHER (?:is None in finally block|was changed during a "
                           r"revert_all_patches))")
_TRACING = ("trace", "symbolic_trace")  # Tracer.trace and torch.fx.symbolic_trace's frames


def _patcher_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    return {"symptom": "a module call went through another thread's tracer" if match.group("submodule")
            else "two traces overlapped"}


def _patcher_explains(match: "re.Match[str]", thread: bool, functions: Tuple[str, ...]) -> bool:
    # The NameError is also what one thread gets for tracing a module kept outside its parent (in a plain list):
    # a main-thread traceback that traced for itself is that mistake, unless it is the patcher's own assertion.
    return bool(match.group("patcher")) or thread or not any(f in _TRACING for f in functions)


LOG_FX_PATCHER_RACE = declare(Rule(
    code="DFD518",
    name="log-fx-patcher-race",
    severity=Severity.ERROR,
    summary="a worker died of the FX patcher race: another thread's torch.fx trace patched nn.Module for every "
    "thread",
    rationale=(
        "torch.fx.symbolic_trace (Tracer.trace) installs a patcher that replaces torch.nn.Module.__call__ and "
        "__getattr__ on the classes, so for every thread of the process, and keeps it in the module global "
        "CURRENT_PATCHER (torch/fx/_symbolic_trace.py of torch 2.13.0: _new_patcher, path_of_module; docs/races.md, "
        "'The FX patcher race'). While one thread traces, "
        "another thread's plain eager module call goes through the tracer's wrapper and raises 'NameError: module "
        "is not installed as a submodule'; two traces that overlap restore each other's patches and one ends in "
        "'AssertionError: CURRENT_PATCHER is None in finally block' (or 'CURRENT_PATCHER was changed during a "
        "revert_all_patches'). A compiled call that meets the patches while Dynamo traces it fails inside Dynamo, "
        "'TorchRuntimeError: RuntimeError when making fake tensor call ... got NameError('module is not installed "
        "as a submodule')' (seen on the H200, docs/gpu-results.md): the same race. It hits eager code as well as "
        "compiled code, without the FX RuntimeError of "
        "DFD501, and the fixes for that race (the thread-local FX flag, non-lazy backward, warm-up, a first-call lock) "
        "do not touch it: they concern torch.compile, not torch.fx's patcher. A threaded trainer with three eager "
        "drafters and two threads looping symbolic_trace lost threads to it in each of 4 runs on torch 2.13 "
        "(fixtures/logs/README.md). "
        "A traceback of the main thread that traced for itself and got the NameError is a module kept outside "
        "its parent (a plain list), not this race, and is reported as DFD513."
    ),
    fix=(
        "Run torch.fx tracing (graph inspection, profiling) before the worker threads start or in another process, "
        "or serialise it with the workers' steps under one lock. " + fix_text(Hazard.PATCHER_RACE)
    ),
    example_format="log",
    bad=(
        "Exception in thread drafter-1:\n"
        "Traceback (most recent call last):\n"
        '  File "/srv/job/train.py", line 58, in run\n'
        "    out = self.model(batch)\n"
        '  File "/usr/lib/python3.11/site-packages/torch/fx/_symbolic_trace.py", line 888, in module_call_wrapper\n'
        "    return self.call_module(mod, forward, args, kwargs)\n"
        '  File "/usr/lib/python3.11/site-packages/torch/fx/_symbolic_trace.py", line 516, in path_of_module\n'
        '    raise NameError("module is not installed as a submodule")\n'
        "NameError: module is not installed as a submodule\n"
    ),
    good=(
        "[drafter-1] step=30 loss=0.41 6.8 Ktok/s\n"
        "[profiler] traced 412 graphs\n"
    ),
), triggers=("NameError", "CURRENT_PATCHER"), fatal=True, pattern=_PATCHER_RACE,
    details=_patcher_details, explains_block=_patcher_explains,
    describe=lambda d: f"the FX patcher race: {d['symptom']} (torch.fx patches nn.Module for every thread "
    "while one traces)",
    next_steps=lambda found, threads, count: [
        "dflash-doctor scan <trainer dir>: the torch.fx.symbolic_trace / Tracer().trace calls that run next to the "
        "worker threads", fix_step(LOG_RULES["DFD518"].rule)])

_TRITON_NEEDS = re.compile(r"out of resource: (?P<resource>[A-Za-z_ ]+?)(?:,|\.|$)(?:.*?Required: (?P<required>\d+))?"
                           r"(?:.*?Hardware limit:? (?P<limit>\d+))?")


def _triton_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    needs = _TRITON_NEEDS.search(text)
    if needs is None:
        return {"resource": None}
    return {"resource": needs.group("resource").strip(),
            "required": int(needs.group("required")) if needs.group("required") else None,
            "hardware_limit": int(needs.group("limit")) if needs.group("limit") else None}


def _triton_message(details: Dict[str, Any]) -> str:
    what = details.get("resource") or "a resource"
    need = ""
    if details.get("required") is not None and details.get("hardware_limit") is not None:
        need = f" (a kernel needs {details['required']:,}, the GPU has {details['hardware_limit']:,})"
    return f"Triton kernel out of {what}{need}: a kernel configuration, not CUDA memory"


LOG_TRITON_OUT_OF_RESOURCES = declare(Rule(
    code="DFD510",
    name="log-triton-out-of-resources",
    severity=Severity.ERROR,
    summary="a Triton kernel asked for more shared memory (or registers) than the GPU has",
    rationale=(
        "triton.runtime.errors.OutOfResources ('out of resource: shared memory, Required: N, Hardware limit: M') "
        "is raised when a generated kernel's block sizes and pipeline stages need more on-chip memory than the "
        "GPU offers. It is not a CUDA OOM: freeing memory or shrinking the batch changes nothing. It shows up with "
        "flex_attention and inductor kernels tuned for a bigger GPU (an H100 config on a smaller card), or with "
        "large head dimensions."
    ),
    fix=(
        "Give the kernel smaller tiles: flex_attention(..., kernel_options={'BLOCK_M': 64, 'BLOCK_N': 64, "
        "'num_stages': 1}), or let inductor autotune (mode='max-autotune'); a smaller head dimension also helps."
    ),
    example_format="log",
    bad=(
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/workspace/train.py", line 88, in <module>\n'
        "[rank0]:     loss = step(batch)\n"
        "[rank0]: torch._inductor.exc.InductorError: OutOfResources: out of resource: shared memory, Required: "
        "131072, Hardware limit: 101376. Reducing block sizes or `num_stages` may help.\n"
    ),
    good=(
        "[rank0]: step: 10  loss:  7.85  memory: 37.2GiB(39.16%)  tps: 5,856\n"
    ),
), triggers=("OutOfResources", "OutOfMemoryError: out of resource", "Hardware limit"), fatal=True,
    # (inductor re-raises it as 'OutOfMemoryError: out of resource: triton_tem_...'; a paste may keep only the
    # 'out of resource: shared memory, Required: N, Hardware limit: M' sentence)
    pattern=re.compile(r"\bOutOfResources\b|out of resource: "), details=_triton_details,
    describe=_triton_message)

# The watchdog's abort comes before the CUDA kinds: its termination line names them as its inner cause
# ('... watchdog thread terminated with exception: CUDA error: an illegal memory access ...').
_ABORT_INNER = (
    ("collective timeout", re.compile(r"Watchdog caught collective operation timeout|ran for \d+ milliseconds"
                                      r"|checkTimeout")),
    ("illegal memory access", re.compile(r"illegal memory access")),
    ("NCCL error", re.compile(r"NCCL error|nccl\w*Error|unhandled (?:cuda|system) error", re.I)),
    ("heartbeat monitor timeout", re.compile(r"Heartbeat monitor timed out|watchdog got stuck"
                                             r"|Terminating the process after attempting to dump debug info")),
)


# Older releases' end of a process after its collective timed out (scanner.py reads them as that timeout's end).
NCCL_TAKEN_DOWN = r"Some NCCL operations have failed or timed out|taking the entire process down"


def _abort_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    rank = _RANK_MENTION.search(text)
    inner = next((name for name, pattern in _ABORT_INNER if pattern.search(text)), None)
    return {"rank": int(rank.group("rank")) if rank else None, "inner_cause": inner}


_TAKEN_DOWN = re.compile(NCCL_TAKEN_DOWN)


def _abort_line(scanner: RuleScanner, line: RuleLine, details: Dict[str, Any]) -> Optional[str]:
    """C++ prints 'terminate called ...' without a rank, before or after the line that names it."""
    memory = scanner.memory
    worker = line.worker
    if worker == UNNAMED:
        last = memory.last_abort
        if last is not None and line.lineno - last.lineno <= ABORT_LINES:
            worker = last.worker
        elif _TAKEN_DOWN.search(line.body) and 0 <= line.lineno - memory.last_timeout <= ABORT_LINES:
            return None  # older releases: the timeouts just reported take their processes down
        else:
            if memory.held_abort is None:
                memory.held_abort = HeldLine(UNNAMED, line.lineno, line.body, details)
            return None
    memory.held_abort = None
    memory.last_abort = HeldLine(worker, line.lineno)
    return worker


LOG_NCCL_WATCHDOG_ABORT = declare(Rule(
    code="DFD512",
    name="log-nccl-watchdog-abort",
    severity=Severity.ERROR,
    summary="ProcessGroupNCCL's watchdog aborted the process (C++ terminate, no Python traceback)",
    rationale=(
        "When a collective times out or the CUDA context breaks, ProcessGroupNCCL's watchdog thread throws "
        "c10::DistBackendError in C++: 'terminate called after throwing an instance of 'c10::DistBackendError'' "
        "then 'what(): [PG 0 Rank 1] Process group watchdog thread terminated with exception: ...' and only C++ "
        "frames ('frame #0: c10::Error::Error(...)'). The process dies of SIGABRT and no Python traceback is "
        "printed, so the reason is the 'what()' text: a collective timeout (another rank stopped calling "
        "collectives), an illegal memory access, or a NCCL error. The evidence names which. Releases before the "
        "watchdog reported its own termination threw the timeout itself: 'terminate called after throwing an "
        "instance of 'std::runtime_error'' then 'what():  [Rank 7] Watchdog caught collective operation timeout'. "
        "When the watchdog itself hangs, the heartbeat monitor ends the process ('Heartbeat monitor timed out', "
        "'Terminating the process after attempting to dump debug info'). Older releases followed each timeout "
        "with 'Some NCCL operations have failed or timed out ... taking the entire process down': that is the "
        "timeout's own end, reported with it (DFD504)."
    ),
    fix=(
        "Read inner_cause: a timeout means look for the rank that stopped first (its own death or stall is the "
        "real cause); an illegal memory access see DFD511; a NCCL error see DFD516."
    ),
    example_format="log",
    bad=(
        "[rank1]:[E1129 09:40:02.414 ProcessGroupNCCL.cpp:1595] [PG 0 Rank 1] Process group watchdog thread "
        "terminated with exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580, "
        "OpType=ALLREDUCE, NumelIn=4096, NumelOut=4096, Timeout(ms)=600000) ran for 600067 milliseconds before "
        "timing out.\n"
        "terminate called after throwing an instance of 'c10::DistBackendError'\n"
        "Exception raised from ncclCommWatchdog at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1599 (most "
        "recent call first):\n"
        "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57 (0x7f8a in libc10.so)\n"
    ),
    good=(
        "[rank1]:[I1129 09:30:02.414 ProcessGroupNCCL.cpp:2012] [PG 0 Rank 1] ProcessGroupNCCL initialized\n"
    ),
), triggers=("watchdog thread terminated", "ProcessGroupNCCL", "DistBackendError", "Some NCCL operations",
             "what():", "ncclCommWatchdog"),
    fatal=True,
    # Before the watchdog thread reported its own termination, it threw the timeout itself: 'terminate called
    # after throwing ... std::runtime_error' then 'what():  [Rank 7] Watchdog caught collective operation timeout'.
    pattern=re.compile(r"watchdog thread terminated(?: with\b|\s*$)"  # or wrapped
                       r"|what\(\):\s+\[(?:PG [^\]]{0,120}?)?Rank \d+\] Watchdog caught collective"
                       # the watchdog's what() cut right after the process group and rank it names
                       r"|what\(\):\s+\[PG [^\]]{0,120}?Rank \d+\]?\s*$"
                       r"|instance of '?c10::DistBackendError|Heartbeat monitor timed out"
                       # the heartbeat monitor's fatal record, when the watchdog itself hung
                       r"|Terminating the process after attempting to dump debug info"
                       r"|ProcessGroupNCCL::WorkNCCL::checkTimeout|Exception raised from (?:checkTimeout|ncclCommWatchdog)"
                       # torch >= 2.6 runs the watchdog as ProcessGroupNCCL::Watchdog ('Exception raised from run at
                       # .../ProcessGroupNCCL.cpp:2063', frames 'c10d::ProcessGroupNCCL::Watchdog::runLoop()')
                       r"|ProcessGroupNCCL::Watchdog::run|Exception raised from run(?:Loop)? at \S*ProcessGroupNCCL"
                       # a c10::Error's backtrace through the watchdog thread (printed when it terminated)
                       r"|frame #\d+: c10d::ProcessGroupNCCL::(?:ncclCommWatchdog|workCleanupLoop|watchdogHandler)\("
                       r"|" + NCCL_TAKEN_DOWN),
    details=_abort_details, on_line=_abort_line, line_is_death=True, records_only=True, next_steps=_after_a_timeout,
    describe=lambda d: "ProcessGroupNCCL's watchdog aborted the process"
    + (f" ({d['inner_cause']})" if d.get("inner_cause") else ""))


_OOM_GPU = re.compile(r"GPU (?P<a>\d+) has a total capac?i?ty|\(GPU (?P<b>\d+);|\bOOM\b[^\n]{0,20}?\b(?:on|at) "
                      r"(?:device |GPU |cuda:|rank )(?P<c>\d+)|Out of memory error on GPU (?P<d>\d+)")
_OOM_TRIED = re.compile(r"Tried to allocate (?P<size>[\d.]+ ?[KMGT]?i?B)")


def _oom_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    gpu = _OOM_GPU.search(text)
    index = int(next(g for g in gpu.groups() if g is not None)) if gpu else gpu_in(text)
    tried = _OOM_TRIED.search(text)
    return {"gpu": index, "tried_to_allocate": tried.group("size") if tried else None}


def _per_gpu(worker: str, details: Dict[str, Any]) -> tuple:
    return (worker, details.get("gpu"))


LOG_CUDA_OOM = declare(Rule(
    code="DFD502",
    name="log-cuda-oom",
    severity=Severity.ERROR,
    summary="CUDA out of memory",
    rationale=(
        "An OOM kills the step (and, in a worker thread, the worker). The message names the GPU ('GPU 2 has a "
        "total capacity of ...'; torch 2.1 printed 'total capacty'; older torch: '(GPU 2; ... total capacity "
        "...)'; some trainers: 'OOM on device 2'), which the evidence carries so it can be joined with a GPU "
        "snapshot. Older and lower-level wordings count too ('cuda runtime error (2) : out of memory', THC's "
        "'error=2 : out of memory', 'CUDA error: out of memory', CUDA_ERROR_OUT_OF_MEMORY, cuBLAS's "
        "CUBLAS_STATUS_ALLOC_FAILED, torch.OutOfMemoryError named alone, as error reports list the class); the "
        "host's OOM killer is not one of them (DFD514), nor are Java's and Ray's OutOfMemoryError. In flex_attention "
        "pipelines an OOM inside sdpa_dense or math_attention means the uncompiled dense path ran (DFD505)."
    ),
    fix="Check DFD505 first; otherwise reduce batch or sequence length on that GPU.",
    example_format="log",
    bad=(
        "Exception in thread drafter-2:\n"
        "Traceback (most recent call last):\n"
        '  File "/workspace/train.py", line 702, in run\n'
        "    loss.backward()\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 12.00 GiB. GPU 7 has a total capacity of "
        "139.81 GiB of which 3.12 GiB is free. Including non-PyTorch memory, this process has 136.68 GiB memory "
        "in use.\n"
    ),
    good=(
        "[drafter-2] step=300 loss=2.10 7.0 Ktok/s\n"
    ),
), triggers=("of memory", "OOM", "Tried to allocate", "OUT_OF_MEMORY", "MemoryAllocation", "ALLOC_FAILED",
             "OutOfMemoryError"),
    fatal=True,
    # (PaddlePaddle's allocator: 'Out of memory error on GPU 0. Cannot allocate 6.93GB memory on GPU 0'; Java's and
    # Ray's OutOfMemoryError are host memory)
    pattern=re.compile(r"(?:CUDA|[Cc]uda|HIP|XPU) out of memory|Out of memory error on GPU \d"
                       r"|(?<!java\.lang\.)(?<!ray\.exceptions\.)OutOfMemoryError(?!: out of resource)|\bOOM\b[^\n]{0,20}?\b(?:on|at) "
                       r"(?:device|GPU|cuda:|rank) ?\d|Tried to allocate [\d.]+ ?[KMGT]?i?B \(GPU \d+; "
                       r"[\d.]+ ?[KMGT]?i?B total capacity"
                       # older and lower-level wordings: THC's 'cuda runtime error (2) : out of memory' and
                       # 'THCudaCheck FAIL ... error=2 : out of memory', 'CUDA error: out of memory', the driver
                       # and runtime enums, cuBLAS failing to allocate its workspace, spconv's tensorview
                       r"|[Cc][Uu][Dd][Aa] runtime error(?: \(2\))? ?: ?out of memory|\berror=2 : out of memory"
                       r"|CUDA error: out of memory|cuda failed with error 2 out of memory"
                       r"|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED"
                       # NCCL's own warning ('NCCL WARN Cuda failure 'out of memory''), MXNet's allocator
                       r"|Cuda failure 'out of memory'|cudaMalloc(?:Async)? failed: out of memory"),
    details=_oom_details, finding_key=_per_gpu, next_steps=_scan_for_uncompiled("DFD502"),
    describe=lambda d: "CUDA out of memory" + _on_gpu(d)
    + (f" (tried to allocate {d['tried_to_allocate']})" if d.get("tried_to_allocate") else ""))

LOG_CUDA_ILLEGAL_MEMORY_ACCESS = declare(Rule(
    code="DFD511",
    name="log-cuda-illegal-memory-access",
    severity=Severity.ERROR,
    summary="a CUDA kernel read or wrote memory it does not own (illegal memory access)",
    rationale=(
        "'CUDA error: an illegal memory access was encountered' is a kernel fault: an out-of-bounds index, a "
        "tensor used on the wrong device or after it was freed, or a bug in a custom or generated kernel. CUDA "
        "reports it asynchronously, so the Python frame in the traceback is often not the culprit, and the CUDA "
        "context is unusable afterwards: every later call on that GPU fails, and NCCL peers time out waiting. "
        "It is not an out-of-memory condition."
    ),
    fix=(
        "Rerun with CUDA_LAUNCH_BLOCKING=1 (and TORCH_USE_CUDA_DSA for device-side asserts) to get the real "
        "frame; check indices (embedding ids < vocab size) and devices of the tensors that kernel touches; "
        "compute-sanitizer names the faulting kernel."
    ),
    example_format="log",
    bad=(
        "[rank3]: Traceback (most recent call last):\n"
        '[rank3]:   File "/workspace/train.py", line 211, in step\n'
        "[rank3]:     loss.item()\n"
        "[rank3]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "[rank3]: CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
        "below might be incorrect.\n"
    ),
    good=(
        "[rank3]: step=40 loss=2.2 9.1 Ktok/s\n"
    ),
), triggers=("illegal memory access",), fatal=True,
    pattern=re.compile(r"an illegal memory access was encountered|cudaErrorIllegalAddress|CUDA_ERROR_ILLEGAL_ADDRESS"),
    details=_gpu_details,
    describe=lambda d: "CUDA error: an illegal memory access was encountered" + _on_gpu(d)
    + " (a kernel fault, not OOM)")

LOG_CUDA_DEVICE_ASSERT = declare(Rule(
    code="DFD517",
    name="log-cuda-device-assert",
    severity=Severity.ERROR,
    summary="a CUDA kernel's own assertion failed (device-side assert): usually an index out of range",
    rationale=(
        "'CUDA error: device-side assert triggered' means a kernel checked its input and stopped: most often a class "
        "label >= the number of classes (cross_entropy, nll_loss), a token id >= the embedding's vocabulary, an "
        "index out of range in gather/scatter/index_select, or a BCE input outside [0, 1]. The kernel's own line "
        "('Assertion `t >= 0 && t < n_classes` failed', printed per GPU thread with its 'block: [..], thread: [..]') "
        "names which, when it was captured, and alone is enough to report it. Like an illegal memory "
        "access it is reported asynchronously and leaves the CUDA context unusable; unlike one, the fix is in the "
        "data, not in a kernel."
    ),
    fix=(
        "Check the ranges of labels and indices against the model (num_classes, vocab size, padding ids); rerun on "
        "the CPU, or with CUDA_LAUNCH_BLOCKING=1, to get the failing line."
    ),
    example_format="log",
    bad=(
        "Traceback (most recent call last):\n"
        '  File "/workspace/train.py", line 139, in main\n'
        "    loss = F.cross_entropy(logits, labels)\n"
        "RuntimeError: CUDA error: device-side assert triggered\n"
    ),
    good=(
        "[rank0] step=10 loss=2.4 9.0 Ktok/s\n"
    ),
), triggers=("device-side assert", "Assertion `", "Device-side assertion `"), fatal=True,
    # The kernel prints its failed check per GPU thread before the host sees the error ('Indexing.cu:1308:
    # indexSelectLargeIndex: block: [56,0,0], thread: [0,0,0] Assertion `srcIndex < srcSelectDimSize` failed.');
    # a paste may keep only those lines.
    pattern=re.compile(r"device-side assert(?:ion)? triggered"
                       r"|block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] Assertion `"
                       r"|\.(?:cu|hip):\d+: \w+: Device-side assertion `"), details=_gpu_details,  # ROCm's kernels
    describe=lambda d: "CUDA error: device-side assert triggered" + _on_gpu(d)
    + " (a kernel's input check: an index or label out of range)")

_NCCL_TIMEOUT = re.compile(
    r"(?:Watchdog caught|Caught) collective operation timeout: WorkNCCL\((?P<work>.*?)\) ran for (?P<ran>\d+) milliseconds"
    r"|watchdog got stuck for (?P<stuck>\d+) seconds"
)


def _timeout_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    rank = _RANK_MENTION.search(text)
    details: Dict[str, Any] = {"rank": int(rank.group("rank")) if rank else None}
    timed = _NCCL_TIMEOUT.search(text)
    if timed is not None and timed.group("ran"):
        limit = re.search(r"Timeout\(ms\)=(\d+)", timed.group("work"))
        details.update(work=timed.group("work"), ran_ms=int(timed.group("ran")),
                       timeout_ms=int(limit.group(1)) if limit else None)
    elif timed is not None:
        details["stuck_s"] = int(timed.group("stuck"))
    return details


def _timeout_message(details: Dict[str, Any]) -> str:
    if details.get("ran_ms") is not None:
        return f"NCCL collective timed out after {details['ran_ms'] / 1000:.0f} s ({details['work']})"
    if details.get("stuck_s") is not None:
        return f"NCCL watchdog stuck for {details['stuck_s']} s"
    return "NCCL collective timed out"


def _timeout_line(scanner: RuleScanner, line: RuleLine, details: Dict[str, Any]) -> Optional[str]:
    scanner.memory.last_timeout = line.lineno  # the abort lines that follow are this timeout's end
    return line.worker


LOG_NCCL_TIMEOUT = declare(Rule(
    code="DFD504",
    name="log-nccl-timeout",
    severity=Severity.ERROR,
    summary="NCCL collective timed out or the process-group watchdog fired",
    rationale=(
        "ProcessGroupNCCL's watchdog aborts a collective that ran past its timeout ('Watchdog caught collective "
        "operation timeout: WorkNCCL(...) ran for N milliseconds before timing out'). One rank that stopped "
        "calling collectives, for example because its worker thread died, hangs every other rank until then. "
        "One finding per rank; repeats are counted in the evidence."
    ),
    fix="Find the rank that stopped first (its last step is lowest in the facts) and why it stopped.",
    example_format="log",
    bad=(
        "[rank3]:[E321 02:07:08.414640780 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, "
        "Timeout(ms)=600000) ran for 600067 milliseconds before timing out.\n"
    ),
    good=(
        "[rank3]:[I321 02:07:08.414640780 ProcessGroupNCCL.cpp:2012] [PG 0 Rank 3] ProcessGroupNCCL initialized\n"
    ),
), triggers=("WorkNCCL", "ProcessGroupNCCL", "NCCL timeout"), fatal=True,
    # A pasted line cut inside the phrase ('... Watchdog caught collective operati') is still the timeout.
    # (work.wait() of older releases raised it in Python: 'RuntimeError: [Rank 1] Caught collective operation
    # timeout: WorkNCCL(...) ran for N milliseconds')
    pattern=re.compile(r"Watchdog caught collective(?: operation timeout|[\w ]{0,12}$)"
                       r"|\] Caught collective operation timeout|watchdog got stuck for \d+ seconds"
                       # (not the key-value store's 'store->get('0') got error: wait timeout' while a communicator
                       # is set up: a rank that never reached it, not a collective that ran too long)
                       r"|NCCL timeout|DistBackendError: (?!.*store->get).*?[Tt]imed? ?out"),
    details=_timeout_details, describe=_timeout_message, on_line=_timeout_line, records_only=True,
    next_steps=_after_a_timeout)

LOG_NCCL_ERROR = declare(Rule(
    code="DFD516",
    name="log-nccl-error",
    severity=Severity.ERROR,
    summary="NCCL reported an error (not a timeout): network, topology or a CUDA failure inside NCCL",
    rationale=(
        "'NCCL error in: .../ProcessGroupNCCL.cpp, unhandled system error' (or 'unhandled cuda error', "
        "'remote process exited or there was a network error', ncclInternalError; TensorFlow's 'NCCL "
        "communication aborted: unhandled system error') means a NCCL call failed, "
        "usually at the first collective: a network interface or InfiniBand setting, shared-memory limits in a "
        "container, mismatched NCCL versions, or a peer rank that already died. Unlike a timeout (DFD504) it fails "
        "fast and names the failing call."
    ),
    fix=(
        "Rerun with NCCL_DEBUG=INFO to see which transport failed; in containers give /dev/shm room (--shm-size) "
        "or set NCCL_SHM_DISABLE=1; pin NCCL_SOCKET_IFNAME; check whether another rank died first."
    ),
    example_format="log",
    bad=(
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/workspace/train.py", line 30, in <module>\n'
        "[rank0]:     dist.barrier()\n"
        "[rank0]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version "
        "2.20.5\n"
    ),
    good=(
        "[rank0]: NCCL INFO Channel 00/02 :    0   1\n"
    ),
), triggers=("NCCL error", "NCCL Error", "ncclInternalError", "ncclSystemError", "ncclUnhandledCudaError",
             "ncclRemoteError", "ncclInvalidUsage", "NCCL communication aborted", "NCCL WARN", "NCCL failure"),
    fatal=True,
    # (TensorFlow's collectives: 'NCCL communication aborted: unhandled system error')
    pattern=re.compile(r"NCCL [Ee]rror|nccl(?:Internal|System|UnhandledCuda|Remote|InvalidUsage)Error"
                       r"|NCCL communication aborted: unhandled"
                       # NCCL's own records (NCCL_DEBUG=WARN) of a failed CUDA call or an InfiniBand completion error,
                       # and nccl-tests' 'Test NCCL failure common.cu:1204 'unhandled cuda error''
                       r"|NCCL WARN Cuda failure '|NCCL WARN NET/IB ?: Got completion from peer .* with (?:error|status)"
                       r"|Test NCCL failure \S+ '"),
    details=_gpu_details, records_only=True,
    describe=lambda d: "NCCL error (a failed NCCL call, not a timeout)")

# Releases before FailOnRecompileLimitHit raised torch._dynamo.exc.CacheLimitExceeded where the limit could not
# fall back to eager (fullgraph=True): either one reaching a traceback ended the run.
_RECOMPILE_FATAL = re.compile(r"(?:FailOnRecompileLimitHit|\bCacheLimitExceeded|Unsupported: Dynamo recompile limit "
                              r"exceeded)(?::\s*(?P<why>.*))?")


def _recompile_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    limit = re.search(r"hit (?:config\.(?P<limit>(?:accumulated_)?(?:recompile_limit|cache_size_limit))|"
                      r"recompilation cache limit) \((?P<value>\d+)\)", text)
    fatal = _RECOMPILE_FATAL.search(text)
    return {"limit": (limit.group("limit") or "cache_size_limit") if limit else None,
            "limit_value": int(limit.group("value")) if limit else None,
            "fatal": fatal is not None,
            "why": (fatal.group("why") or "").strip() if fatal else None}


def _recompile_message(details: Dict[str, Any]) -> str:
    limit = f"config.{details['limit']} ({details['limit_value']})" if details.get("limit") else "its recompile limit"
    where = f" for {details['function']}" if details.get("function") else ""
    if details.get("fatal"):
        why = details.get("why") or "fail_on_recompile_limit_hit or fullgraph=True"
        return (f"Dynamo hit {limit}{where} and stopped the run: {why} (with fullgraph=True the limit is an "
                "error, not an eager fallback)")
    default = (" (the default: on torch 2.12+ a limit raised in the main thread does not reach threads started later)"
               if details.get("limit") and LIMIT_DEFAULTS.get(details["limit"]) == details.get("limit_value") else "")
    return f"Dynamo hit {limit}{where}{default}: later calls run it uncompiled (eagerly)"


def _recompile_line(scanner: RuleScanner, line: RuleLine, details: Dict[str, Any]) -> Optional[str]:
    """The limit warning names its function on a line that follows: held until then (fatal: FailOnRecompileLimitHit
    is reported at once). A limit hit below what the log set earlier is also DFD521's."""
    _limit_not_reached(scanner, line, details)
    if details.get("fatal"):
        return line.worker
    scanner.memory.held_recompile = HeldRecompile(line.worker, line.lineno, details=details)
    return None


def _recompile_severity(details: Dict[str, Any]) -> Optional[Severity]:
    return Severity.ERROR if details.get("fatal") else None


LOG_RECOMPILE_LIMIT = declare(Rule(
    code="DFD506",
    name="log-recompile-limit",
    severity=Severity.WARNING,
    summary="Dynamo hit its recompile limit: the function runs uncompiled, or the run stops if fullgraph=True",
    rationale=(
        "After config.recompile_limit (cache_size_limit before torch 2.6) recompilations of one code object, "
        "Dynamo stops compiling it and runs it eagerly: for flex_attention that is the dense path. With "
        "fullgraph=True (or config.fail_on_recompile_limit_hit) the same limit raises FailOnRecompileLimitHit "
        "(CacheLimitExceeded in older releases) "
        "instead and the worker dies: then the finding is an error. Shapes that change every step (dynamic block "
        "masks, ragged batches) are the usual cause."
    ),
    fix="Mark the varying dimension dynamic, pad to a few bucket sizes, or raise the limit knowingly.",
    example_format="log",
    bad=(
        "W1129 10:02:11.123000 4242 torch/_dynamo/convert_frame.py:1016] torch._dynamo hit "
        "config.recompile_limit (8)\n"
        "W1129 10:02:11.123000 4242 torch/_dynamo/convert_frame.py:1016]    function: 'attend' "
        "(/workspace/dflash_model.py:211)\n"
        "W1129 10:02:11.123000 4242 torch/_dynamo/convert_frame.py:1016]    last reason: 0/7: "
        "tensor 'q' size mismatch at index 2. expected 4096, actual 4160\n"
    ),
    good=(
        "W1129 10:02:11.123000 4242 torch/_dynamo/convert_frame.py:1016] torch._dynamo recompiling 'attend'\n"
    ),
), triggers=("dynamo hit", "FailOnRecompileLimitHit", "CacheLimitExceeded", "recompile limit exceeded"), fatal=True,
    pattern=re.compile(r"(?:torch\._dynamo|torchdynamo) hit (?:config\.)?(?:accumulated_)?(?:recompile_limit"
                       r"|cache_size_limit|recompilation cache limit) \(\d+\)|FailOnRecompileLimitHit"
                       r"|\bCacheLimitExceeded\b|Unsupported: Dynamo recompile limit exceeded"),
    details=_recompile_details, describe=_recompile_message, on_line=_recompile_line,
    severity_of=_recompile_severity, next_steps=_scan_for_uncompiled("DFD506"))

# -- events: no death by themselves ------------------------------------------------------------------------------

# The defaults of the limits (torch/_dynamo/config.py, read in 2.6.0 to 2.14.1): a hit at the default in a worker,
# after the script raised it, is the per-thread settings of torch 2.12+ (dflash_doctor/compile_settings.py).
LIMIT_DEFAULTS = {"recompile_limit": 8, "cache_size_limit": 8, "accumulated_recompile_limit": 256,
                  "accumulated_cache_size_limit": 256}
_LIMIT_SET = re.compile(r"\b(?P<key>(?:accumulated_)?(?:recompile_limit|cache_size_limit))\b['\"]?\s*(?:=|:| to)\s*"
                        r"(?P<value>\d+)")


def _unnamed_is_unknown(worker: str) -> str:
    return "unknown thread" if worker == UNNAMED else worker


def _limit_set_line(scanner: RuleScanner, line: RuleLine) -> None:
    """'torch._dynamo.config.recompile_limit = 64' printed or echoed by the script: remembered for the hits after."""
    scanner.memory.limit_set = HeldLine(line.worker, line.lineno, line.body,
                                        {"key": line.match.group("key"), "value": int(line.match.group("value"))})


def _limit_not_reached(scanner: RuleScanner, line: RuleLine, details: Dict[str, Any]) -> None:
    limit_set = scanner.memory.limit_set
    hit, key = details.get("limit_value"), details.get("limit")
    if limit_set is None or hit is None or key is None or limit_set.details["key"] != key \
            or hit >= limit_set.details["value"]:
        return
    value = limit_set.details["value"]
    worker = _unnamed_is_unknown(line.worker)
    scanner.report(LOG_RULES["DFD521"].rule, (key,),
                   f"{worker}: Dynamo hit config.{key} at {hit} although line {limit_set.lineno} set it to {value}: "
                   "from torch 2.12 compile settings are per thread, so a limit set in one thread (the main one) "
                   "does not reach the threads started later", line.lineno,
                   {"thread": worker, "key": key, "hit": hit, "set_to": value, "set_line": limit_set.lineno,
                    "default": LIMIT_DEFAULTS.get(key) == hit})


LOG_SETTING_NOT_IN_WORKER = declare(Rule(
    code="DFD521",
    name="log-setting-not-in-worker",
    severity=Severity.WARNING,
    summary="a recompile limit raised in one thread was hit at a lower value (the default) in another: compile "
            "settings are per thread from torch 2.12",
    rationale=(
        "From torch 2.12 a value assigned to torch._dynamo.config (and the inductor and functorch configs) lives "
        "in a ContextVar: a thread started later begins with the defaults (docs/races.md, 'What logs reads from "
        "threads'; dflash_doctor/compile_settings.py). A script that raises recompile_limit in its main "
        "thread and then compiles in worker threads sees 'torch._dynamo hit config.recompile_limit (8)' from the "
        "workers: the limit it set never reached them. On 2.11 and earlier the same assignment reached every "
        "thread. Read when the log shows both the setting and a lower hit; a hit at the default alone is DFD506, "
        "whose message says so."
    ),
    fix="Set the limit in each thread that compiles (at the top of the thread's target), or start the threads in a "
        "copy of the setter's context (contextvars.copy_context().run); on 2.11 and earlier a main-thread setting "
        "reaches every thread.",
    example_format="log",
    bad=(
        "set torch._dynamo.config.recompile_limit = 64\n"
        "W1206 08:07:02.533000 17168 torch/_dynamo/convert_frame.py:1994] [0/8] torch._dynamo hit "
        "config.recompile_limit (8)\n"
        "W1206 08:07:02.533000 17168 torch/_dynamo/convert_frame.py:1994] [0/8]    function: 'step' "
        "(/srv/serve.py:8)\n"
    ),
    good=(
        "set torch._dynamo.config.recompile_limit = 64\n"
        "[worker-3] step=40 loss=1.92\n"
    ),
), triggers=("dynamo", "cache_size_limit"), pattern=_LIMIT_SET, on_match=_limit_set_line)

# Dynamo's recompile log when a frame's guards failed at the call but passed when it looked for the reason
# (torch/_dynamo/guards.py: 'Unexpected recompilation: runtime guards failed even though they passed during
# recompilation-reason analysis'): another thread changed what the guards read between the two checks.
_RACED = re.compile(r"Unexpected recompilation: runtime guards failed even though they passed")
_RECOMPILING = re.compile(r"Recompiling function (?P<function>\S+) in (?P<where>\S+)")


def _raced_line(scanner: RuleScanner, line: RuleLine) -> None:
    worker = _unnamed_is_unknown(line.worker)
    scanner.report(LOG_RULES["DFD520"].rule, (),
                   f"{worker}: Dynamo recompiled a frame whose guards failed at the call and passed on a second look "
                   "('runtime guards failed even though they passed'): threads were making the first calls of one "
                   "compiled function at once, and each call recompiled it (the recompile limit follows)",
                   line.lineno, {"thread": worker})


def _raced_steps(found: Sequence[Finding], threads: Dict[str, dict], count: int) -> Optional[List[str]]:
    return ["call the compiled function once per input shape in one thread before starting the workers (a warm-up), "
            "or hold a lock around each thread's first call",
            "dflash-doctor run -- <your command>: which threads compiled, and when",
            fix_step(LOG_RULES["DFD520"].rule)]


LOG_THREADS_RACED_FIRST_CALL = declare(Rule(
    code="DFD520",
    name="log-threads-raced-first-call",
    severity=Severity.WARNING,
    summary="threads made the first calls of one compiled function at once: Dynamo recompiled it again and again",
    rationale=(
        "Dynamo checks a frame's guards, compiles on a miss, and explains the recompile by checking the guards "
        "again. 'Unexpected recompilation: runtime guards failed even though they passed during "
        "recompilation-reason analysis' means the two checks disagreed: another thread changed the state the "
        "guards read in between. Run on a CPU with torch 2.13 (benchmarks/logs_heldback/programs/"
        "first_call_storm.py: 16 threads calling one compiled function for the first time), every recompile after "
        "the first said so and the recompile limit was hit within a second, after which the function runs "
        "uncompiled; a public report shows the same with 32 threads ('Worker errors observed: 8/32 threads "
        "failed'). A single thread does not print it."
    ),
    fix="Warm the compiled function up in one thread (one call per shape) before the workers start, or serialise "
        "each thread's first call with a lock.",
    example_format="log",
    bad=(
        "V1206 08:06:42.305000 16074 torch/_dynamo/guards.py:5396] [0/2] [__recompiles] Recompiling function step "
        "in /srv/serve.py:8\n"
        "V1206 08:06:42.305000 16074 torch/_dynamo/guards.py:5396] [0/2] [__recompiles]     triggered by the "
        "following guard failure(s):\n"
        "V1206 08:06:42.305000 16074 torch/_dynamo/guards.py:5396] [0/2] [__recompiles]     - 0/1: Unexpected "
        "recompilation: runtime guards failed even though they passed during recompilation-reason analysis.\n"
    ),
    good=(
        "V1206 08:06:42.305000 16074 torch/_dynamo/guards.py:5396] [0/1] [__recompiles]     - 0/0: tensor 'x' size "
        "mismatch at index 0. expected 4, actual 5\n"
    ),
), triggers=("Unexpected recompilation",), pattern=_RACED, on_match=_raced_line, next_steps=_raced_steps)

def _dense_warning_line(scanner: RuleScanner, line: RuleLine) -> None:
    scanner.report(LOG_RULES["DFD505"].rule, (), f"{line.worker}: flex_attention ran without torch.compile (dense "
                   "path that materialises the full scores matrix)", line.lineno, dict(thread=line.worker,
                                                                                         via="warning"))


LOG_DENSE_ATTENTION_FALLBACK = declare(Rule(
    code="DFD505",
    name="log-dense-attention-fallback",
    severity=Severity.WARNING,
    summary="flex_attention ran its uncompiled dense path",
    rationale=(
        "torch warns 'flex_attention called without torch.compile() - this will use an unfused implementation "
        "that materializes the full scores matrix' when flex_attention runs eagerly, and a traceback through "
        "sdpa_dense or math_attention shows the same path. With error_on_nested_fx_trace=False the FX race also "
        "lands here silently. The dense path is slow and, at training lengths, runs out of memory."
    ),
    fix="Call flex_attention through torch.compile, and do not silence error_on_nested_fx_trace (DFD301).",
    example_format="log",
    bad=(
        "/usr/lib/python3.12/site-packages/torch/nn/attention/flex_attention.py:1601: UserWarning: flex_attention "
        "called without torch.compile() - this will use an unfused implementation that materializes the full "
        "scores matrix instead of generating a fused kernel.\n"
    ),
    good=(
        "[drafter-1] compiled flex_attention for seq_len=4096\n"
    ),
), triggers=("flex_attention called without",),
    pattern=re.compile(r"flex_attention called without torch\.compile\(\)"), on_match=_dense_warning_line,
    next_steps=_scan_for_uncompiled("DFD505"))

# Signal deaths: torchrun's summary ('Signal 9 (SIGKILL) received by PID 4242'), its agent ('failed (exitcode:
# -9) local_rank: 0 (pid: 4242)'), torch.multiprocessing ('process 0 terminated with signal SIGSEGV'),
# subprocess ('died with <Signals.SIGKILL: 9>'), the shell ('Killed', 'Segmentation fault (core dumped)'), the
# kernel's OOM killer and faulthandler ('Fatal Python error: Segmentation fault').
SIGNALS = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
           11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}
_SHELL_SIGNALS = {"Killed": "SIGKILL", "Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT",
                  "Bus error": "SIGBUS", "Illegal instruction": "SIGILL", "Floating point exception": "SIGFPE",
                  "Terminated": "SIGTERM", "已杀死": "SIGKILL", "段错误": "SIGSEGV",  # bash in a zh_CN locale
                  # zsh: 'zsh: segmentation fault (core dumped)  python train.py', 'zsh: killed  python ...'
                  "segmentation fault": "SIGSEGV", "bus error": "SIGBUS", "killed": "SIGKILL", "abort": "SIGABRT",
                  "illegal hardware instruction": "SIGILL", "floating point exception": "SIGFPE",
                  "terminated": "SIGTERM", "illegal instruction": "SIGILL"}
SIGNAL_MEANING = {
    "SIGKILL": "killed from outside: usually the host's OOM killer (check `dmesg`), or a scheduler or launcher",
    "SIGSEGV": "a native crash (C++/CUDA extension, driver): run under faulthandler or gdb for its stack",
    "SIGABRT": "abort() in native code: a C++ exception such as ProcessGroupNCCL's watchdog, or a failed assert",
    "SIGBUS": "a bus error: usually /dev/shm too small for DataLoader workers (raise --shm-size)",
    "SIGTERM": "stopped by the launcher or scheduler, often because another rank failed first",
    "SIGINT": "interrupted (Ctrl-C, or a launcher shutting workers down)",
    "SIGILL": "an illegal instruction: a binary built for another CPU or GPU architecture",
    "SIGFPE": "an arithmetic fault in native code",
}
# torch's DataLoader signal handler, in the worker: 'ERROR: Unexpected segmentation fault encountered in worker.'
_LOADER_SIGNALS = {"bus error": "SIGBUS", "segmentation fault": "SIGSEGV", "floating-point exception": "SIGFPE"}
# Windows has no signals: a crashed process exits with an NTSTATUS, printed signed, unsigned or in hex.
_NTSTATUS = {"C0000005": "SIGSEGV", "C000001D": "SIGILL", "C00000FD": "SIGSEGV", "C0000409": "SIGABRT"}
_NTSTATUS_DECIMAL = {"-1073741819": "C0000005", "3221225477": "C0000005", "-1073741795": "C000001D",
                     "3221225501": "C000001D", "-1073741571": "C00000FD", "3221225725": "C00000FD",
                     "-1073740791": "C0000409", "3221226505": "C0000409"}
# DeepSpeed's launcher: "[ERROR] [launch.py:321:sigkill_handler] ['python', '-u', 'train.py', '--local_rank=1', ...]
# exits with return code = -9"
_DS_LOCAL_RANK = re.compile(r"'--local_rank=(\d+)'")
@dataclass(frozen=True)
class SignalReading:
    """What one wording of a signal death says; `meaning` None: the signal's usual meaning (SIGNAL_MEANING)."""

    signal: Optional[str]
    pid: Optional[str] = None
    meaning: Optional[str] = None
    local_rank: Optional[int] = None
    rank: Optional[int] = None
    cancelled: bool = False
    worker_kind: Optional[str] = None


SignalDecoder = Callable[["re.Match[str]", str], SignalReading]


@dataclass(frozen=True)
class SignalWording:
    """One way a signal death is printed: who prints it, its pattern (named groups of its own), how to read it, and
    a line as that tool prints it (tests/logs/test_signal_wordings.py reads each back)."""

    wording: str
    pattern: str
    decode: SignalDecoder
    example: str
    signal: Optional[str]  # what `example` decodes to


def _numbered(number: int) -> str:
    return SIGNALS.get(number, f"signal {number}")


def _named(group: str) -> SignalDecoder:
    return lambda m, text: SignalReading(m.group(group), pid=m.group("pid") if "pid" in m.re.groupindex else None)


def _shell_named(m: "re.Match[str]", text: str) -> SignalReading:
    return SignalReading(_SHELL_SIGNALS[m.group("name")], pid=m.group("pid") if "pid" in m.re.groupindex else None)


def _host_oom(m: "re.Match[str]", text: str) -> SignalReading:
    return SignalReading("SIGKILL", pid=m.group("pid"), meaning="the host's OOM killer (host RAM, not GPU memory)")


def _agent_told(signal: str) -> SignalReading:
    return SignalReading(signal, meaning="the torchrun agent itself was told to stop (scheduler, Ctrl-C or a timeout)")


def _agent_exit(m: "re.Match[str]", text: str) -> SignalReading:
    return SignalReading(_numbered(-int(m.group("exitcode"))), pid=m.group("pid"),
                         local_rank=int(m.group("local_rank")))


def _deepspeed_exit(m: "re.Match[str]", text: str) -> SignalReading:
    named = _DS_LOCAL_RANK.search(text)
    return SignalReading(_numbered(-int(m.group("code"))), local_rank=int(named.group(1)) if named else None)


def _windows(code: str, shown: str) -> SignalReading:
    signal = _NTSTATUS[code]
    return SignalReading(signal, meaning=f"Windows NTSTATUS {shown}: " + SIGNAL_MEANING.get(signal, ""))


def _loader_killed(m: "re.Match[str]", text: str) -> SignalReading:
    name = m.group("name")
    return SignalReading(_SHELL_SIGNALS[name] if name else None, pid=m.group("pid"), worker_kind="DataLoader worker")


_SHELL_WORDS = "Killed|Segmentation fault|Aborted|Bus error|Illegal instruction|Floating point exception|Terminated"

# In the order they are tried at one position of a line (a regex alternation: the leftmost match wins, and at one
# position the first wording that matches).
SIGNAL_WORDINGS: Tuple[SignalWording, ...] = (
    SignalWording("torchrun's summary", r"[Ss]ignal \d+ \((?P<name>SIG[A-Z]+)\) received by PID (?P<pid>\d+)",
                  _named("name"), "  error_file: <N/A>  Signal 9 (SIGKILL) received by PID 4242", "SIGKILL"),
    SignalWording("torchrun's agent", r"failed \(exitcode: (?P<exitcode>-\d+)\) local_rank: (?P<local_rank>\d+) "
                  r"\(pid: (?P<pid>\d+)\)", _agent_exit,
                  "api.py:869] failed (exitcode: -11) local_rank: 2 (pid: 4244) of binary: /usr/bin/python3",
                  "SIGSEGV"),
    SignalWording("torch 1.9-1.10's agent", r"Child process (?P<pid>\d+) \(local_rank (?P<local_rank>\d+)\) FAILED "
                  r"\(exitcode (?P<exitcode>-\d+)\)", _agent_exit,
                  "ERROR:torch.distributed.elastic.multiprocessing.api:Child process 32378 (local_rank 0) FAILED "
                  "(exitcode -9)", "SIGKILL"),
    SignalWording("torch.multiprocessing and subprocess",
                  r"(?:terminated|died|killed|exited) (?:with|by) (?:signal )?<?(?:Signals\.)?(?P<name>SIG[A-Z]+)",
                  _named("name"), "process 0 terminated with signal SIGSEGV", "SIGSEGV"),
    # PyCharm: 'Process finished with exit code 137 (interrupted by signal 9: SIGKILL)' (full-width in a CJK locale)
    # (gdb's 'Program received signal SIGINT, Interrupt.' is the debugger stopping a live process, not a death)
    SignalWording("PyCharm and others", r"(?:interrupted by|received) signal (?:\d+[:\uff1a] ?)?(?P<name>SIG[A-Z]+)\b"
                  r"(?!, (?:Interrupt|Trace/breakpoint))", _named("name"),
                  "Process ended (interrupted by signal 9: SIGKILL)", "SIGKILL"),
    SignalWording("a shell, PyCharm or docker: 128 + the signal's number",
                  r"(?:finished|exited) with (?:exit )?code (?P<code>13[0-9]|14[0-3])\b",
                  lambda m, text: SignalReading(_numbered(int(m.group("code")) - 128)),
                  "Process finished with exit code 134", "SIGABRT"),
    SignalWording("torchrun's agent told to stop", r"SignalException: Process (?P<pid>\d+) got signal: (?P<num>\d+)",
                  lambda m, text: replace(_agent_told(_numbered(int(m.group("num")))), pid=m.group("pid")),
                  "torch.distributed.elastic.multiprocessing.api.SignalException: Process 8665 got signal: 1",
                  "SIGHUP"),
    SignalWording("torchrun's agent, by name", r"Received (?:Signals\.)?(?P<name>SIG[A-Z]+) death signal",
                  lambda m, text: _agent_told(m.group("name")), "Received Signals.SIGTERM death signal, shutting "
                  "down workers", "SIGTERM"),
    SignalWording("torchrun's agent, by number", r"Received (?P<num>\d+) death signal",
                  lambda m, text: _agent_told(_numbered(int(m.group("num")))),
                  "Received 15 death signal, shutting down workers", "SIGTERM"),
    # (its '[host:pid]' may be gone)
    SignalWording("Open MPI's crash report", r"(?:\] |^\s*)Signal: [A-Za-z -]+ \((?P<num>\d+)\)",
                  lambda m, text: SignalReading(_numbered(int(m.group("num")))),
                  "[node7:12345] Signal: Segmentation fault (11)", "SIGSEGV"),
    SignalWording("Ray's memory monitor", r"killed due to memory pressure",
                  lambda m, text: SignalReading("SIGKILL", meaning="Ray's memory monitor killed it: host RAM ran "
                                                "short (not GPU memory)"),
                  "1 Workers (tasks / actors) killed due to memory pressure (OOM)", "SIGKILL"),
    SignalWording("the kernel's OOM killer", r"Out of memory: ?Killed process (?P<pid>\d+)", _host_oom,
                  "[ 4018.45] Out of memory: Killed process 935 (python) total-vm:113656kB", "SIGKILL"),
    SignalWording("older kernels' OOM killer", r"\bKilled process (?P<pid>\d+) \([^)]*\),? total-vm:", _host_oom,
                  "[ 4018.45] Killed process 935 (python) total-vm:113656kB, anon-rss:9000kB", "SIGKILL"),
    SignalWording("Slurm's cgroup", r"Detected \d+ oom-kill event",
                  lambda m, text: SignalReading("SIGKILL", meaning="the job's cgroup ran out of host memory and its "
                                                "OOM killer killed processes (not GPU memory)"),
                  "slurmstepd: error: Detected 8 oom-kill event(s) in step 59137890.batch cgroup.", "SIGKILL"),
    SignalWording("MosaicML composer's launcher", r"Rank (?P<rank>\d+) crashed with exit code (?P<code>-\d+)",
                  lambda m, text: SignalReading(_numbered(-int(m.group("code"))), rank=int(m.group("rank"))),
                  "ERROR:composer.cli.launcher:Rank 2 crashed with exit code -7.", "SIGBUS"),
    # (older: 'A serious error (Segmentation fault) is detected')
    SignalWording("PaddlePaddle's signal handler", r"FatalError: (?:A serious error \(|`)(?P<name>Segmentation fault"
                  r"|Illegal instruction|Aborted|Bus error|Floating point exception)[`)] is detected", _shell_named,
                  "FatalError: `Segmentation fault` is detected by the operating system.", "SIGSEGV"),
    # (not its pid: the FatalError line, without one, and the shell's report are the same crash)
    SignalWording("PaddlePaddle's SignalInfo", r"\[SignalInfo: \*\*\* (?P<name>SIG[A-Z]+) \(@0x[0-9a-fA-F]+\) "
                  r"received by PID \d+", lambda m, text: SignalReading(m.group("name")),
                  "  [SignalInfo: *** SIGSEGV (@0x0) received by PID 1011 (TID 0x7f) from PID 0 ***]", "SIGSEGV"),
    SignalWording("c10's FatalSignalHandler", r"\bSIG(?P<name>[A-Z]+)\(\d+\), PID: (?P<pid>\d+), Thread \d+:",
                  lambda m, text: SignalReading("SIG" + m.group("name"), pid=m.group("pid")),
                  "SIGABRT(6), PID: 4242, Thread 4243:", "SIGABRT"),
    SignalWording("UCX", r"Caught signal (?P<num>\d+) \(",
                  lambda m, text: SignalReading(_numbered(int(m.group("num")))),
                  "[host:1016852:0:1020747] Caught signal 11 (Segmentation fault: address not mapped)", "SIGSEGV"),
    SignalWording("AddressSanitizer", r"AddressSanitizer: (?P<name>SEGV|BUS|ABRT|FPE|ILL)\b",
                  lambda m, text: SignalReading("SIG" + m.group("name")),
                  "==4242==ERROR: AddressSanitizer: SEGV on unknown address 0x000000000000", "SIGSEGV"),
    SignalWording("absl's failure handler", r"\*\*\* (?P<name>SIG[A-Z]+) received at time=",
                  lambda m, text: SignalReading(m.group("name")),
                  "E0101 10:00:00.000 4242 failure_signal_handler.cc:345] *** SIGSEGV received at time=1701000000 on "
                  "cpu 3 ***", "SIGSEGV"),
    SignalWording("a C++ allocation failure nothing caught",
                  r"terminate called after throwing an instance of '(?P<type>[\w:]*(?:bad_alloc|BadAlloc))'",
                  lambda m, text: SignalReading("SIGABRT", meaning=f"a C++ allocation failed ({m.group('type')}) "
                                                "and nothing caught it: out of memory"),
                  "terminate called after throwing an instance of 'paddle::memory::allocation::BadAlloc'", "SIGABRT"),
    SignalWording("faulthandler's crash", r"Fatal Python error: (?P<name>Segmentation fault|Aborted|Bus error"
                  r"|Floating point exception)", _shell_named, "Fatal Python error: Segmentation fault", "SIGSEGV"),
    # any other fatal error ('none_dealloc: deallocating None', 'PyThreadState_Get: ...') ends in abort()
    SignalWording("Python's other fatal errors", r"Fatal Python error: (?P<what>[A-Za-z_][^:]*?)(?::|\s*$)",
                  lambda m, text: SignalReading("SIGABRT", meaning=f"Python's own fatal error ({m.group('what').strip()}"
                                                "): the interpreter aborted, usually a C/C++ extension's "
                                                "reference-count or thread-state bug"),
                  "Fatal Python error: none_dealloc: deallocating None", "SIGABRT"),
    # (PaddlePaddle: 'DataLoader process (pid 1104) exited is killed by signal: Killed.'; the name may be wrapped
    # onto the next line)
    SignalWording("the DataLoader's watchdog", r"(?:worker|DataLoader process) \(pid (?P<pid>\d+)\) (?:exited )?is "
                  r"killed by signal: ?(?P<name>Bus error|Aborted|Killed|Segmentation fault|Terminated"
                  r"|Floating point exception)?", _loader_killed,
                  "RuntimeError: DataLoader worker (pid 77) is killed by signal: Segmentation fault.", "SIGSEGV"),
    # (PaddlePaddle's loader says 'in DataLoader worker')
    SignalWording("the DataLoader worker's own handler", r"Unexpected (?P<name>(?i:bus error|segmentation fault"
                  r"|floating-point exception)) encountered in (?:DataLoader )?worker",
                  lambda m, text: SignalReading(_LOADER_SIGNALS[m.group("name").lower()],
                                                worker_kind="DataLoader worker"),
                  "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared "
                  "memory (shm).", "SIGBUS"),
    SignalWording("DeepSpeed's launcher", r"\] exits with return code = (?P<code>-\d+)", _deepspeed_exit,
                  "[launch.py:321:sigkill_handler] ['python', '-u', 'train.py', '--local_rank=1'] exits with return "
                  "code = -9", "SIGKILL"),
    SignalWording("Windows, NTSTATUS in hex", r"exit (?:code|status)[: ]+(?:-?\d+ )?\(?0x(?P<code>C0000005|C000001D"
                  r"|C00000FD|C0000409)\b", lambda m, text: _windows(m.group("code"), "0x" + m.group("code")),
                  "Process finished with exit code -1073741819 (0xC0000005)", "SIGSEGV"),
    SignalWording("Windows, NTSTATUS in decimal", r"exit (?:code|status)[: ]+(?P<code>-1073741819|3221225477"
                  r"|-1073741795|3221225501|-1073741571|3221225725|-1073740791|3221226505)\b",
                  lambda m, text: _windows(_NTSTATUS_DECIMAL[m.group("code")], m.group("code")),
                  "Process finished with exit code 3221226505", "SIGABRT"),
    # (reasons a rule above names, such as an illegal memory access or the NCCL watchdog, are matched by it first)
    SignalWording("a C++ exception nothing caught: 'terminate called ...' then its what()",
                  r"^\s*what\(\):\s+(?P<what>\S.*)",
                  lambda m, text: SignalReading("SIGABRT", meaning="a C++ exception nothing caught (terminate, then "
                                                f"abort): {m.group('what').strip()[:200]}"),
                  "  what():  basic_string::_M_construct null not valid", "SIGABRT"),
    # at a line's start, or glued to a progress bar the shell's message overwrote ('5.02it/s]Segmentation fault')
    SignalWording("the shell", r"(?:^[\s>*`]*|(?<=it/s\])|(?<=s/it\]))(?:\S+: line \d+: +(?P<pid>\d+) )?"
                  rf"(?P<name>{_SHELL_WORDS}|已杀死|段错误)(?: *\((?:core dumped|核心已转储)\))?[*`]*(?:\s|$)",
                  _shell_named, "run.sh: line 12: 4242 Killed                  python train.py", "SIGKILL"),
    SignalWording("zsh", r"^[\s>*`]*zsh: (?P<name>segmentation fault|bus error|killed|abort"
                  r"|illegal hardware instruction|floating point exception|terminated)\b", _shell_named,
                  "zsh: illegal hardware instruction  python train.py", "SIGILL"),
    SignalWording("the shell, lower case", r"^[\s>*`]*(?P<name>segmentation fault|bus error|illegal instruction) "
                  r"\(core dumped\)", _shell_named, "bus error (core dumped)", "SIGBUS"),
    # ("... and said 'Segmentation fault (core dumped)'")
    SignalWording("the shell's message quoted anywhere in a line", r"(?P<name>Segmentation fault|Aborted|Bus error"
                  r"|Illegal instruction|Floating point exception) \(core dumped\)", _shell_named,
                  "the job printed 'Aborted (core dumped)' and stopped", "SIGABRT"),
    SignalWording("Slurm's memory limit", r"exceeded memory limit \([^)]*\), being killed",
                  lambda m, text: SignalReading("SIGKILL", meaning="Slurm killed the job for exceeding its memory "
                                                "limit (host RAM, not GPU memory)"),
                  "slurmstepd: error: Job 42 exceeded memory limit (9000 > 8000), being killed", "SIGKILL"),
    SignalWording("Slurm's cancellation", r"\*\*\* JOB \d+ ON \S+ CANCELLED AT",
                  lambda m, text: SignalReading("SIGTERM", cancelled=True, meaning="Slurm cancelled the job (time "
                                                "limit, preemption or scancel): read the rest of its line"),
                  "slurmstepd: error: *** JOB 59137890 ON node7 CANCELLED AT 2025-01-01T00:00:00 DUE TO TIME "
                  "LIMIT ***", "SIGTERM"),
    # numbered, as buildbot and others print it: 'process killed by signal 9'
    SignalWording("numbered", r"killed by signal (?P<num>\d+)\b",
                  lambda m, text: SignalReading(SIGNALS.get(int(m.group("num")), f"signal {m.group('num')}")),
                  "program finished: process killed by signal 9", "SIGKILL"),
)
_UNNAMED = re.compile(r"\(\?P<\w+>")
# One alternation of every wording, each wrapped in a group of its own (w0, w1, ...; its inner groups unnamed), so
# the prefilter's line is searched once; the wording that matched then reads its own groups.
_SIGNAL_LINE = re.compile("|".join(f"(?P<w{index}>{_UNNAMED.sub('(?:', wording.pattern)})"
                                   for index, wording in enumerate(SIGNAL_WORDINGS)))
_WORDING_PATTERNS = tuple(re.compile(wording.pattern) for wording in SIGNAL_WORDINGS)


def signal_wording(match: "re.Match[str]") -> int:
    """The index in SIGNAL_WORDINGS of the wording a match of the signal rule's pattern is."""
    return int((match.lastgroup or "w")[1:])


def _signal_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    index = signal_wording(match)
    own = _WORDING_PATTERNS[index].match(text, match.start())
    assert own is not None  # the same pattern, tried where its alternative matched
    reading = SIGNAL_WORDINGS[index].decode(own, text)
    details: Dict[str, Any] = {"signal": reading.signal, "pid": int(reading.pid) if reading.pid else None,
                               "meaning": reading.meaning if reading.meaning is not None
                               else SIGNAL_MEANING.get(reading.signal or "", "")}
    if reading.local_rank is not None:
        details["local_rank"] = reading.local_rank
    if reading.cancelled:
        details["cancelled"] = True
    if reading.rank is not None:
        details["rank"] = reading.rank
    if reading.worker_kind:
        details["worker_kind"] = reading.worker_kind
    return details


def _signal_line(scanner: RuleScanner, line: RuleLine, details: Dict[str, Any]) -> Optional[str]:
    if "Fatal Python error" in line.body or "received signal" in line.body:
        scanner.memory.fatal_error_line = line.lineno  # faulthandler's (or gdb's) thread dump follows: the crash's
    if details.get("cancelled") and scanner.is_dead(line.worker):
        return None  # the scheduler's closing line for a job a line above already said it killed
    return line.worker


def _per_signal(worker: str, details: Dict[str, Any]) -> tuple:
    # a DataLoader worker's crash is printed twice (by the worker, then by the loader with its pid)
    return (worker, details.get("signal"), "DataLoader" if details.get("worker_kind") else details.get("pid"))


LOG_KILLED_BY_SIGNAL = declare(Rule(
    code="DFD514",
    name="log-killed-by-signal",
    severity=Severity.ERROR,
    summary="a worker process was killed by a signal (SIGKILL, SIGSEGV, SIGABRT, SIGBUS, ...)",
    rationale=(
        "A process killed by a signal prints no Python traceback: what is left is torchrun's 'Signal 9 "
        "(SIGKILL) received by PID N' or 'exitcode: -9', DeepSpeed's 'exits with return code = -9', the shell's "
        "'Killed' or 'Segmentation fault (core dumped)', the kernel's 'Out of memory: Killed process N', a "
        "DataLoader worker's 'Unexpected segmentation fault encountered in worker', or faulthandler's 'Fatal "
        "Python error' (its thread dump is the crash's stack, not a hang); zsh reports 'zsh: segmentation fault' "
        "or 'zsh: killed'; other launchers and handlers use their own words (MosaicML composer's 'Rank 2 crashed "
        "with exit code -7', Slurm's 'Detected 8 oom-kill event(s)' in a job's cgroup, PaddlePaddle's 'FatalError: "
        "`Segmentation fault` is detected by the operating system'). The signal says where to look: SIGKILL is usually the host OOM killer, SIGSEGV a native crash, SIGABRT a C++ "
        "abort (often the NCCL watchdog, DFD512), SIGBUS a full /dev/shm, SIGTERM the launcher stopping workers "
        "after another rank failed."
    ),
    fix="Follow the signal's meaning in the evidence; for SIGKILL check `dmesg` for the OOM killer and host RAM.",
    example_format="log",
    bad=(
        "E1129 09:41:10.771000 4001 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) "
        "local_rank: 2 (pid: 4244) of binary: /usr/bin/python3\n"
    ),
    good=(
        "W1129 09:41:10.771000 4001 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 4244 "
        "closing signal SIGTERM\n"
    ),
), triggers=("SIG", "oom-kill event", "exceeded memory limit", "CANCELLED AT", "exitcode: -", "FAILED (exitcode -", "Received ", "Signal: ", "Caught signal", "AddressSanitizer", "BadAlloc", "SignalException", "with exit code", "exited with code", "memory pressure", "Killed", "Segmentation fault", "Aborted", "Bus error",
             "Terminated", "Floating point exception", "Fatal Python error", "killed by signal",
             "encountered in worker", "encountered in DataLoader worker", "exits with return code", "what():",
             "exit code", "exit status", "已杀死",
             "段错误", "zsh: ", "(core dumped)"),
    fatal=True,
    pattern=_SIGNAL_LINE, details=_signal_details, on_line=_signal_line, line_is_death=True, death_kind="signal",
    finding_key=_per_signal, explains_cut_traceback=False,
    next_steps=lambda found, threads, count: [
        "dmesg -T | grep -i -e 'killed process' -e 'out of memory': SIGKILL is usually the host's OOM killer (host "
        "RAM, not GPU memory)"] if any(f.evidence.get("signal") == "SIGKILL" for f in found) else None,
    describe=lambda d: (f"{d['worker_kind']} " if d.get("worker_kind") else "")
    + f"killed by {d.get('signal') or 'a signal'}"
    + (f" (pid {d['pid']})" if d.get("pid") else "") + (f": {d['meaning']}" if d.get("meaning") else ""))

def _stack_dump_line(scanner: RuleScanner, line: RuleLine) -> None:
    if line.match.group("pyspy_pid"):
        # 'Process 12: ...' is py-spy's header only under its command; its threads may not have been pasted
        if "py-spy" in (scanner.line_before() or "") and scanner.memory.pyspy_header is None:
            scanner.memory.pyspy_header = HeldLine(line.stream or UNNAMED, line.lineno)
        return
    scanner.memory.pyspy_header = None
    scanner.start_dump(line.lineno, line.stream, line.body[line.match.start():])  # glued to prose: '... stack:Thread 5'


def _dump_steps(found: Sequence[Finding], threads: Dict[str, dict], count: int) -> Optional[List[str]]:
    if any(f.evidence.get("cycle") == "compile-lock-autograd" for f in found):
        return [f"dflash-doctor repro --threads {count} --shapes per-thread: reproduce the deadlock here"] + fix_line(
            (Hazard.DEADLOCK, Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG))
    return ["py-spy dump --pid PID a second time: threads that have not moved are stuck where the dump shows"]


LOG_STACK_DUMP_HANG = declare(Rule(
    code="DFD515",
    name="log-stack-dump-hang",
    severity=Severity.WARNING,
    summary="an all-thread stack dump of a stuck process (py-spy dump, faulthandler timeout)",
    rationale=(
        "Someone dumped the stacks of a process that stopped making progress (`py-spy dump --pid`, "
        "faulthandler.dump_traceback_later's 'Timeout (0:10:00)!', pystack, or gdb's 'thread apply all bt' and "
        "'(gdb) bt' taken by hand). The dump shows where each thread waits. When "
        "one thread compiles under Dynamo's compile_lock while waiting for the autograd engine, and another waits "
        "for compile_lock in the backward compiler (compile_fx_backward), it is the compile-lock / autograd "
        "device-thread deadlock: the finding is then an error and names it. A dump printed by a crash ('Fatal "
        "Python error') is the crash's stack, reported as DFD514 instead."
    ),
    fix=(
        "For the compile-lock cycle: compile the backward with the forward (dflash_doctor.runtime."
        "enable_non_lazy_backward()) or warm every shape in one thread first; `dflash-doctor repro --threads N` "
        "shows which mitigation holds here. Otherwise read which lock or queue the waiting threads block on."
    ),
    example_format="log",
    bad=(
        "Process 4242: python train.py\n"
        "Python v3.11.7 (/usr/bin/python3.11)\n"
        "\n"
        'Thread 0x7F31C36BF740 (idle): "drafter-0"\n'
        "    _engine_run_backward (torch/autograd/graph.py:825)\n"
        "    grad (torch/autograd/__init__.py:496)\n"
        "    _compile (torch/_dynamo/convert_frame.py:1020)\n"
        "    run (train.py:640)\n"
        'Thread 0x7F31B0FFD640 (idle): "Thread-3"\n'
        "    compile_fx_backward (torch/_inductor/compile_fx.py:1340)\n"
        "    backward (torch/_functorch/_aot_autograd/runtime_wrappers.py:2000)\n"
    ),
    good=(
        "[drafter-0] step=12 loss=2.61 7.1 Ktok/s\n"
    ),
), triggers=("Thread ", "thread 0x", "Process ", "Traceback for thread"),
    # (a header may follow a colon of the paster's prose on the same line: '... call stack:  Thread 59633 (active)')
    pattern=re.compile(r"(?:^|(?<=[:\uff1a]))\s*(?:Current thread|Thread) (?:0x[0-9a-fA-F]+|\d+) \((?:most recent call first|"
                       r"(?:idle|active)(?:\+gil)?)\)(?:: \"(?P<name>[^\"]*)\")?"
                       r"|^\s*Thread \((?:idle|active)(?:\+gil)?\): \"(?P<unnamed>[^\"]*)\""
                       # py-spy's own header ('Process 4242: python train.py'), read only right after 'py-spy dump'
                       r"|^\s*Process (?P<pyspy_pid>\d+): \S"
                       # gdb's 'thread apply all bt' and pystack's dumps (logs/stackdump.py)
                       r"|^(?:Thread \d+|\[Switching to thread \d+) \(Thread 0x[0-9a-fA-F]+ \(LWP \d+\)"
                       r"|^Traceback for thread \d+ \("),
    on_match=_stack_dump_line, next_steps=_dump_steps)

# -- deaths no rule above explains, and progress ---------------------------------------------------------------

LOG_THREAD_DIED = declare(Rule(
    code="DFD508",
    name="log-thread-died",
    severity=Severity.ERROR,
    summary="a thread died with an exception",
    rationale=(
        "'Exception in thread NAME:' is Python's threading.excepthook reporting a thread whose target raised: "
        "the thread is gone and whatever it fed (a GPU, a queue) is starved. Reported when no more specific rule "
        "(DFD501, DFD502, DFD504, DFD509-DFD512, DFD516) explains the exception."
    ),
    fix="Read the exception; `dflash-doctor status` joins it with the GPU the thread left idle.",
    example_format="log",
    bad=(
        "Exception in thread target-3:\n"
        "Traceback (most recent call last):\n"
        '  File "/workspace/train.py", line 512, in run\n'
        "    batch = queue.get(timeout=600)\n"
        "_queue.Empty\n"
    ),
    good=(
        "[target-3] step=80 5.0 Ktok/s\n"
    ),
), triggers=("Exception in thread",))

def _exit_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    """torchrun's agent ('failed (exitcode: 1) local_rank: 3'), DeepSpeed's launcher ('... '--local_rank=3' ...]
    exits with return code = 1'), or an exception's last line with no traceback above it."""
    if match.group("exception") is not None:
        return {"exception": match.group("exception"), "said": (match.group("said") or "").strip()[:200]}
    if match.group("exitcode") is not None:
        return {"exitcode": int(match.group("exitcode")), "local_rank": int(match.group("local_rank"))}
    if match.group("old_exitcode") is not None:
        return {"exitcode": int(match.group("old_exitcode")), "local_rank": int(match.group("old_local_rank"))}
    if match.group("comp_exitcode") is not None:
        return {"exitcode": int(match.group("comp_exitcode")), "rank": int(match.group("comp_rank"))}
    rank = _DS_LOCAL_RANK.search(text)
    exitcode = int(match.group("ds_exitcode")) if match.group("ds_exitcode") else None
    details: Dict[str, Any] = {"exitcode": exitcode, "local_rank": int(rank.group(1)) if rank else None}
    if match.group("ds_cut"):
        details["cut"] = True
    return details


def _exit_line(scanner: RuleScanner, line: RuleLine, details: Dict[str, Any]) -> Optional[str]:
    if (details.get("exception") or "").endswith("ChildFailedError"):
        return None  # torchrun's own exception: its summary, parsed from here on, names the rank that failed
    if details.get("cut"):
        # DeepSpeed's launcher line without its return code: a terminal may have wrapped the rest onto the next
        # line; reported at the end unless that line comes
        scanner.memory.launcher_cut = HeldLine(line.worker, line.lineno, details=details)
        return None
    return line.worker


LOG_PROCESS_DIED = declare(Rule(
    code="DFD513",
    name="log-process-died",
    severity=Severity.ERROR,
    summary="a process (its main thread, or one rank) ended with an uncaught exception",
    rationale=(
        "A traceback outside any 'Exception in thread' block is the main thread's: the process ends with it. "
        "Under torchrun (torch >= 2.2) every line a rank prints carries a '[rankN]:' prefix, so tracebacks of "
        "several ranks can interleave and are still told apart; torchrun's ChildFailedError summary names the "
        "rank that failed first ('Root Cause (first observed failure)'). An exception's last line with no traceback "
        "above it ('RuntimeError: ...' at the start of a line) and a traceback cut before its exception count too: "
        "the process ended with them even though the log lost part of the text; so do frames pasted without their "
        "'Traceback' line (read in logs small enough to parse in full, as pasted excerpts are), and torchrun's own "
        "traceback when nothing else in the log names the worker that failed. Reported when no more specific "
        "rule explains the exception. A worker that keeps logging progress after its traceback only logged a "
        "handled error and is not counted as dead."
    ),
    fix="Read the exception of the root-cause rank first: the other ranks usually died because it did.",
    example_format="log",
    bad=(
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/workspace/train.py", line 77, in <module>\n'
        "[rank1]:     batch = next(loader)\n"
        "[rank1]: KeyError: 'input_ids'\n"
        "E1129 09:41:10.771000 4001 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
        "local_rank: 1 (pid: 4243) of binary: /usr/bin/python3\n"
    ),
    good=(
        "[rank1]: step=10 loss=2.9 6.2 Ktok/s\n"
    ),
), triggers=("Traceback (most", "ChildFailedError", "Root Cause (first observed failure)",
             "exitcode", "Process ", "exits with return code", "launch.py:", "Error:", "Exception:",
             "crashed with exit code"),
    pattern=re.compile(r"failed \(exitcode: (?P<exitcode>\d+)\) local_rank: (?P<local_rank>\d+)"
                       r"|Child process \d+ \(local_rank (?P<old_local_rank>\d+)\) FAILED \(exitcode (?P<old_exitcode>\d+)\)"
                       r"|\] exits with return code = (?P<ds_exitcode>[1-9]\d*)"
                       # MosaicML composer's launcher: 'ERROR:composer.cli.launcher:Rank 2 crashed with exit code 1.'
                       r"|Rank (?P<comp_rank>\d+) crashed with exit code (?P<comp_exitcode>[1-9]\d*)"
                       # the same DeepSpeed line cut before its return code: a subprocess ended, how is lost
                       r"|(?P<ds_cut>\[launch\.py:\d+:sigkill_handler\] \[)(?![^\n]*\] exits with return code)"
                       # 'RuntimeError: ...' starting a line outside any traceback: the traceback was not pasted
                       # (or not printed), the exception still ended the process; quoting and markdown stripped
                       r"|^(?:\[\d+\] )?[\s>*`\x22\x27]*(?P<exception>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception))"
                       r"(?:\*\*)?:"  # (a log viewer's '[13] ' line number before it)
                       r"(?P<said>.*)"),
    details=_exit_details, on_line=_exit_line, line_is_death=True,
    describe=lambda d: (f"died: {d['exception']}: {d['said']} (its traceback is not in the log)" if d.get("exception")
                        else f"exited with code {d.get('exitcode')} (the reason is in its own output, before this)"
                        if d.get("exitcode") is not None
                        else "exited; the launcher's line was cut before its return code"))

LOG_THROUGHPUT_DROP = declare(Rule(
    code="DFD503",
    name="log-throughput-drop",
    severity=Severity.WARNING,
    summary="sustained throughput drop against the rolling baseline (per worker, or their total)",
    rationale=(
        "Throughput is read in the forms trainers print: '7.1 Ktok/s', 'tokens/s=9800', torchtitan's 'tps: "
        "5,856', 'samples/s', tqdm's 'it/s' and 's/it', Megatron's 'elapsed time per iteration (ms)'; only the "
        "number that belongs to the unit, never a neighbouring loss. Each worker's series has a baseline (median "
        "of the last --baseline-window samples); a drop fires when --sustain consecutive samples are all more "
        "than --drop below it, so one noisy line never fires. The sum over workers is watched too (when the log "
        "prints no total of its own): a dead worker takes its share with it while the survivors look healthy. A "
        "short log that ends on a lower level (two or more samples after at least three before) is a drop too."
    ),
    fix="Look at what happened just before the 'from_line' of the evidence: a dead thread, a recompile, an OOM.",
    example_format="log",
    bad=(
        "step=1 21.4 Ktok/s\nstep=2 21.6 Ktok/s\nstep=3 21.5 Ktok/s\nstep=4 21.3 Ktok/s\nstep=5 21.7 Ktok/s\n"
        "step=6 21.5 Ktok/s\nstep=7 21.4 Ktok/s\nstep=8 21.6 Ktok/s\nstep=9 21.5 Ktok/s\nstep=10 21.5 Ktok/s\n"
        "step=11 14.2 Ktok/s\nstep=12 14.1 Ktok/s\nstep=13 14.3 Ktok/s\nstep=14 14.0 Ktok/s\nstep=15 14.2 Ktok/s\n"
    ),
    good=(
        "step=1 21.4 Ktok/s\nstep=2 21.6 Ktok/s\nstep=3 21.5 Ktok/s\nstep=4 21.3 Ktok/s\nstep=5 21.7 Ktok/s\n"
        "step=6 21.5 Ktok/s\nstep=7 21.4 Ktok/s\nstep=8 21.6 Ktok/s\nstep=9 21.5 Ktok/s\nstep=10 21.5 Ktok/s\n"
        "step=11 9.1 Ktok/s\nstep=12 21.1 Ktok/s\nstep=13 21.3 Ktok/s\nstep=14 21.0 Ktok/s\nstep=15 21.2 Ktok/s\n"
    ),
), next_steps=lambda found, threads, count: [
    f"read the log just before line {found[0].evidence.get('from_line', found[0].line)}: a worker that died, a "
    "recompile or a fallback explains most drops"])

LOG_THREAD_STALLED = declare(Rule(
    code="DFD507",
    name="log-thread-stalled",
    severity=Severity.WARNING,
    summary="a thread stopped making step progress while the others kept going",
    rationale=(
        "A worker that logs step=N and then nothing while its peers advance is hung (a deadlock on Dynamo's "
        "compile lock against the autograd device thread is the known one) or died without a traceback in this "
        "log. It fires when another thread advanced by --stall-steps steps (at least three of the stalled "
        "thread's own step increments) since the stalled thread's last progress line. Workers whose death "
        "is reported are not repeated here."
    ),
    fix="Dump all thread stacks of the live process (py-spy dump --pid PID) to see where it waits.",
    example_format="log",
    bad=(
        "[drafter-0] step=1 7.1 Ktok/s\n[drafter-1] step=1 7.2 Ktok/s\n"
        "[drafter-0] step=2 7.1 Ktok/s\n[drafter-1] step=2 7.2 Ktok/s\n"
        + "".join(f"[drafter-1] step={n} 7.2 Ktok/s\n" for n in range(3, 60))
    ),
    good=(
        "".join(f"[drafter-0] step={n} 7.1 Ktok/s\n[drafter-1] step={n} 7.2 Ktok/s\n" for n in range(1, 60))
    ),
), next_steps=lambda found, threads, count: [
    f"py-spy dump --pid PID: where {', '.join(_workers(found))} wait (a compile-lock deadlock shows "
    "compile_fx_backward on one thread and autograd on another)"])

# Which codes name why a worker died, for `status` and the views.
DEATH_CODES = tuple(code for code, entry in LOG_RULES.items() if entry.fatal) + (
    LOG_THREAD_DIED.code, LOG_PROCESS_DIED.code)
