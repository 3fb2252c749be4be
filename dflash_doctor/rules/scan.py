"""Static-scan rules (DFD1xx checkpointing, DFD2xx threads and compile, DFD3xx configuration).

Each rule is declared once, here, as a `ScanRule`: its registry metadata (code, name, rationale, fix, bad/good
examples), the byte triggers that decide whether a file is parsed for it at all, the words whose lines hold every
node it judges, and the checks (classes in dflash_doctor/scan/) that report it. The scanner derives its byte
prefilter (scan/source_file.py), its candidate lines and its dispatch (scan/analysis.py) from `SCAN_RULES`, so a new
rule is a change in this module plus the check that reports it; its examples are its tests (tests/scan/).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, FrozenSet, Optional, Tuple

from dflash_doctor import dataparallel
from dflash_doctor.checkpoint_entry_points import CALL_WORDS, TRL_CONFIG_NAMES, coverage_sentence
from dflash_doctor.compile_settings import SETTINGS
from dflash_doctor.findings import Severity
from dflash_doctor.hazards import Hazard
from dflash_doctor.mitigations import REGISTRY
from dflash_doctor.rules.registry import Rule, register


@dataclass(frozen=True, eq=False)  # compared by identity: rules sharing a trigger test a file's bytes once
class ByteTrigger:
    """What a file's bytes must hold for a rule to possibly fire: one of `words`, with `near` matching within a few
    hundred bytes of it (patterns are line-local), and `anywhere` matching the whole file when it is given, and one
    of `anywhere_words` somewhere in it when they are given (a substring search: on a large file several times
    cheaper than a regex whose first character is common)."""

    words: Tuple[bytes, ...]
    near: "re.Pattern[bytes]"
    anywhere: Optional["re.Pattern[bytes]"] = None
    anywhere_words: Tuple[bytes, ...] = ()


@dataclass(frozen=True)
class ScanRule:
    """How the scanner finds one DFD1xx-3xx rule.

    `checks`: the classes that report it, named under dflash_doctor.scan ("module.Class", each a
    `scan.file_check.FileCheck`, which says whether it needs the file's call graph); analysis.py imports them
    (CHECK_CLASSES), this table never does (they import it). `words`: names whose lines hold every call, assignment or dict the checks
    judge (names bound to them on such lines are followed too); no other line is looked at. `triggers`: the file
    is parsed for the rule when its bytes match any. `after_files`: judged by the engine once every file is read,
    from what the other rules left (no checks, words or triggers of its own). `hazards`: for a rule about what
    threads do, the hazards a program with such a finding has; its findings are judged against the fixes of that
    program (scan/programs.py): mitigated only when those cover every hazard of the program."""

    rule: Rule
    checks: Tuple[str, ...] = ()
    words: Tuple[str, ...] = ()
    triggers: Tuple[ByteTrigger, ...] = ()
    after_files: bool = False
    hazards: FrozenSet[Hazard] = frozenset()


SCAN_RULES: Dict[str, ScanRule] = {}  # by code


def declare(rule: Rule, *, checks: Tuple[str, ...] = (), words: Tuple[str, ...] = (),
            triggers: Tuple[ByteTrigger, ...] = (), after_files: bool = False,
            hazards: FrozenSet[Hazard] = frozenset()) -> Rule:
    """Register `rule` and how the scanner finds it."""
    if rule.example_format != "python":
        raise ValueError(f"{rule.code}: scan rules are written as Python sources")
    SCAN_RULES[rule.code] = ScanRule(register(rule), checks, words, triggers, after_files, hazards)
    return rule


def thread_hazards() -> Dict[str, FrozenSet[Hazard]]:
    """Code -> hazards, for the rules whose findings are judged per program."""
    return {code: entry.hazards for code, entry in SCAN_RULES.items() if entry.hazards}


# -- byte triggers -------------------------------------------------------------------------------------------
# Every spelling the rules resolve still names its trigger in the file: torch.utils.checkpoint is reached through
# "utils.checkpoint", "checkpoint.checkpoint", "utils import ... checkpoint" or a relative import of it; a spawn
# site names Thread/Timer/ThreadPool; the other rules name their function or key.

CHECKPOINT_IMPORT = ByteTrigger((b"checkpoint",), re.compile(
    rb"utils\.checkpoint|checkpoint\.checkpoint|utils\s+import\s+(?:[^\n;]*|\([^)]*)\bcheckpoint\b"
    rb"|from\s+\.+\s*checkpoint\s+import|from\s+\.+\s+import\s+(?:[^\n;]*|\([^)]*)\bcheckpoint\b"
))
# `supports_gradient_checkpointing = True` (every transformers model class) is not the switch.
HF_SWITCH = ByteTrigger((b"gradient_checkpointing", b"activation_checkpointing"), re.compile(
    rb"(?:gradient|activation)_checkpointing_(?:enable|kwargs)|(?<!\w)gradient_checkpointing\s*=\s*True"))
# The library entry points that switch it on for the user (dflash_doctor/checkpoint_entry_points.py): a
# `gradient_checkpointing` given a value that is not a literal False/None (a parameter, a field default, a config
# attribute; `self.gradient_checkpointing = False` in every transformers model is not the switch), PEFT's preparation
# helpers, TRL's trainer configs and trainers (in a file importing trl). The last two are looked for only in files
# that say `checkpoint`: every file of the scan corpus (14,648) that calls a PEFT helper does (its flag, a resume or
# output checkpoint), and it keeps the prefilter at one substring search per file for all DFD1xx rules (a file
# without `checkpoint` is known after DFD101's search; benchmarks/scan_bench.py's target).
LIBRARY_SWITCH = ByteTrigger((b"gradient_checkpointing",), re.compile(
    rb"(?<![\w.])gradient_checkpointing\s*(?::[^=\n]*)?=(?!=)\s*(?!False\b|None\b|0\b)"))
PEFT_ENTRY = ByteTrigger((b"checkpoint",), re.compile(rb"checkpoint"),
                         re.compile(rb"prepare_model_for_(?:kbit|int8)_training"))
# `from trl import`, `import trl` + `trl.X` and `from trl.trainer import` all hold `trl import` or `trl.`: a leading
# literal keeps the whole-file regex fast (a leading \b or alternation, or one pattern for both triggers, made it the
# costliest of the prefilter)
TRL_ENTRY = ByteTrigger((b"checkpoint",), re.compile(rb"checkpoint"), re.compile(rb"trl(?: import\b|\.)"))
# Thread, Timer and the pools resolve only through an import of their module (or a base class that the linker
# follows to one): a file that names none of these cannot start a thread the rules recognise.
THREAD_SPAWN = ByteTrigger(
    (b"Thread", b"Timer", b"multiprocessing.dummy"),
    re.compile(rb"Thread\s*[(),]|Thread\s+as\b|Timer\s*\(|ThreadPool|multiprocessing\.dummy"),
    re.compile(rb"threading|concurrent|multiprocessing|class\s+\w+\s*\([^)]*Thread\b"),
)
# A file that applies a mitigation (scan/fixes.py) is read for DFD201 too, though it may start no thread. torch's
# switch counts only when set to the literal True (assigned, setattr or config.patch), so a file that merely defines
# or reads it (torch's own config and compiler) is not parsed for it.
_SET_TO = rb"""['"]?\s*(?::\s*[\w.]+\s*)?[=,:]\s*\(*\s*"""  # `key = `, `key: bool = `, `"key", `, `key=`, `"key": `
# torch's own functions that apply a registry fix when called with one literal (their name is the entry's source
# marker): single-threaded autograd is `set_multithreading_enabled(False)`; True, or a variable, is not the fix.
TORCH_SWITCHES: Dict[str, object] = {"set_multithreading_enabled": False}
APPLIED_MITIGATION = ByteTrigger(
    (b"dflash_doctor", b"force_non_lazy_backward_lowering") + tuple(name.encode() for name in TORCH_SWITCHES),
    re.compile(rb"dflash_doctor|force_non_lazy_backward_lowering" + _SET_TO + rb"True\b" + b"".join(
        rb"|" + name.encode() + rb"\s*\(\s*(?:mode\s*=\s*)?" + repr(value).encode() + rb"\b"
        for name, value in TORCH_SWITCHES.items())))
# The function itself: not the module (`flex_attention.noop_mask`, `flex_attention import X`), not a longer name;
# torch's flex_attention resolves only through an import that names its module (absolute or relative).
FLEX_CALL = ByteTrigger(
    (b"flex_attention",), re.compile(rb"\bflex_attention\b(?!\s*import\b)(?!\.)"),
    re.compile(rb"nn\.attention\.flex_attention|attention\s+import\s+(?:[^\n;]*|\([^)]*)\bflex_attention\b"
               rb"|from\s+\.+\s*flex_attention\s+import"),
)
# Only the values that silence the guard (scan/dynamo_config.py SILENCING: a falsy constant for the first key, a
# truthy one for the second) can fire DFD301; torch's own definitions of the defaults cannot.
DYNAMO_CONFIG_KEY = ByteTrigger((b"_fx_trace",), re.compile(
    rb"error_on_nested_fx_trace" + _SET_TO + rb"(?:False|None|0+)\b"
    rb"|force_compile_during_fx_trace" + _SET_TO + rb"(?:True|\d*[1-9]\d*)\b"))

# nn.DataParallel, its functional form and parallel_apply, called with a module (DistributedDataParallel and
# FullyShardedDataParallel are not: one process per GPU, no replica threads), in a file that says `compile`. One
# word, "arallel", stands for all three: every word is a search of every file, and this one is rare.
_REPLICATING_CALL = rb"(?<!\w)(?:DataParallel|parallel_apply|data_parallel)\s*\(\s*[\w(\[]"
DATA_PARALLEL_CALL = ByteTrigger((b"arallel",), re.compile(_REPLICATING_CALL), re.compile(rb"compile"))
# A Hugging Face (or TRL, sentence-transformers) training configuration with torch_compile switched on, or a
# Trainer built (its model may be compiled): both scripts name a Trainer or TrainingArguments ("Train").
TRAINER_COMPILE = ByteTrigger(
    (b"Train",), re.compile(rb"Train"),
    re.compile(rb"\btorch_compile\s*=\s*True\b|(?<!class )\b\w*Trainer\s*\((?!\s*\))"),  # not a class statement
    anywhere_words=(b"torch_compile", b"Trainer"),  # found first: the regex runs in the few files that have one
)

# -- candidate-line words (aliases bound on their lines are added by analysis.candidate_lines) ---------------

CHECKPOINT_CALLS = ("checkpoint", "checkpoint_sequential")
HF_KWARGS = ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs")
# torch.distributed's checkpoint_wrapper and its CheckpointImpl (often handed to apply_activation_checkpointing)
CHECKPOINT_WRAPPERS = ("checkpoint_wrapper", "CheckpointImpl")
# Every marker of the mitigation registry: scan/fixes.py looks for their calls on these lines.
MITIGATION_MARKERS = tuple(sorted({marker for entry in REGISTRY for marker in entry.source_markers}))

CHECKPOINT_USE_REENTRANT_TRUE = declare(Rule(
    code="DFD101",
    name="checkpoint-use-reentrant-true",
    severity=Severity.WARNING,
    summary="gradient checkpointing with use_reentrant=True",
    rationale=(
        "The reentrant checkpoint re-runs the forward inside backward on the autograd engine's device thread. "
        "Any torch.compile'd code inside it then compiles (or re-checks its guards) from that thread, where "
        "Dynamo's compile lock and the FX-tracing flag are shared with every other worker thread. Upstream "
        "deprecated the reentrant variant; use_reentrant=False is the supported path. Reported wherever the value "
        "is set: torch's checkpoint calls and partials, torch's CheckpointFunction.apply called directly, and "
        "Hugging Face's gradient_checkpointing_kwargs as a keyword, an attribute, a subscript, a config dict or a "
        "TrainingArguments subclass's field default. A name is judged on every value it is bound to in its scope, "
        "a parameter by its default, a config object's attribute by its class's field default, so a default of "
        "True on one path counts."
    ),
    fix="Pass use_reentrant=False (and verify with `dflash-doctor repro`: on its own it does not remove the race).",
    bad=(
        "import torch.utils.checkpoint as tuc\n"
        "\n"
        "def chunk_loss(fn, x):\n"
        "    return tuc.checkpoint(fn, x, use_reentrant=True)  # DFD101\n"
    ),
    good=(
        "import torch.utils.checkpoint as tuc\n"
        "\n"
        "def chunk_loss(fn, x):\n"
        "    return tuc.checkpoint(fn, x, use_reentrant=False)\n"
    ),
), checks=("checkpointing.CheckpointRule", "library_switches.LibrarySwitchRule"),
    words=CHECKPOINT_CALLS + HF_KWARGS + ("use_reentrant", "CheckpointFunction") + CHECKPOINT_WRAPPERS,
    triggers=(CHECKPOINT_IMPORT, HF_SWITCH, LIBRARY_SWITCH, PEFT_ENTRY))

CHECKPOINT_USE_REENTRANT_IMPLICIT = declare(Rule(
    code="DFD102",
    name="checkpoint-use-reentrant-implicit",
    severity=Severity.WARNING,
    summary="gradient checkpointing without use_reentrant: torch warns and silently runs the reentrant variant",
    rationale=(
        "Called without use_reentrant, torch.utils.checkpoint warns ('Starting in PyTorch 2.9, calling checkpoint "
        "without use_reentrant will raise an exception'; it still does not) and runs the reentrant variant. Code "
        "that looks neutral therefore behaves like use_reentrant=True, which is what the seeds' trainer shipped."
    ),
    fix="State it: use_reentrant=False.",
    bad=(
        "from torch.utils.checkpoint import checkpoint as ckpt\n"
        "\n"
        "def block(layer, h):\n"
        "    return ckpt(layer, h)  # DFD102\n"
    ),
    good=(
        "from torch.utils.checkpoint import checkpoint as ckpt\n"
        "\n"
        "def block(layer, h):\n"
        "    return ckpt(layer, h, use_reentrant=False)\n"
    ),
), checks=("checkpointing.CheckpointRule",),
    words=CHECKPOINT_CALLS, triggers=(CHECKPOINT_IMPORT,))

CHECKPOINT_USE_REENTRANT_UNKNOWN = declare(Rule(
    code="DFD103",
    name="checkpoint-use-reentrant-unknown",
    severity=Severity.INFO,
    summary="gradient checkpointing whose use_reentrant is not a literal",
    rationale=(
        "use_reentrant comes from a variable or from **kwargs, so which variant runs is decided at run time. "
        "Check the value your launch actually passes: the reentrant variant is the risky one."
    ),
    fix="Pass a literal, or log the value at start-up.",
    bad=(
        "from torch.utils import checkpoint as cp\n"
        "\n"
        "def block(layer, h, reentrant):\n"
        "    return cp.checkpoint(layer, h, use_reentrant=reentrant)  # DFD103\n"
    ),
    good=(
        "from torch.utils import checkpoint as cp\n"
        "\n"
        "def block(layer, h):\n"
        "    return cp.checkpoint(layer, h, use_reentrant=False)\n"
    ),
), checks=("checkpointing.CheckpointRule", "library_switches.LibrarySwitchRule"),
    words=CHECKPOINT_CALLS + HF_KWARGS + ("use_reentrant",) + CHECKPOINT_WRAPPERS,
    triggers=(CHECKPOINT_IMPORT, HF_SWITCH, LIBRARY_SWITCH, PEFT_ENTRY))

HF_GRADIENT_CHECKPOINTING_IMPLICIT = declare(Rule(
    code="DFD104",
    name="hf-gradient-checkpointing-implicit",
    severity=Severity.WARNING,
    summary="Hugging Face gradient checkpointing switched on without use_reentrant (reentrant on transformers 4.x), "
            "also by PEFT's prepare_model_for_kbit_training/int8 and TRL 0.22-0.26's default-on configs",
    rationale=(
        "Hugging Face models forward gradient_checkpointing_kwargs to torch.utils.checkpoint. Left out (a bare "
        "gradient_checkpointing_enable(), or TrainingArguments/TRL configs with gradient_checkpointing=True and no "
        "kwargs, which Trainer passes on as None), every transformers release before 5.0 checkpoints with the "
        "reentrant variant: 4.38-4.57 pass use_reentrant=True, 4.35-4.37 and older leave torch's reentrant "
        "default; 5.0 made use_reentrant=False the default. Kwargs given without use_reentrant reach torch's own "
        "default, the reentrant variant, on every release. The message names the installed transformers release "
        "when there is one (read from package metadata, never imported); on 5.0 or later the finding is info. "
        "Library entry points that switch it on for the user (dflash_doctor/checkpoint_entry_points.py, each read "
        "in the library's sources): " + coverage_sentence() + ". The switch is followed to its value: a literal, a "
        "name, a function parameter's default (`def train(gradient_checkpointing=True)`), the field default of a "
        "project's own TrainingArguments subclass (reported at the field), a config object's field, and the enable "
        "method fetched with getattr(model, \"gradient_checkpointing_enable\") or bound to a local name."
    ),
    fix='model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})',
    bad=(
        "def prepare(model):\n"
        "    model.gradient_checkpointing_enable()  # DFD104\n"
    ),
    good=(
        "def prepare(model):\n"
        '    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})\n'
    ),
), checks=("checkpointing.CheckpointRule", "library_switches.LibrarySwitchRule"),
    # the library entry points' names: their lines are judged for DFD101/103 too, whose triggers hold DFD104's
    # PEFT_ENTRY and LIBRARY_SWITCH, so a file read for one is read for the other
    words=("gradient_checkpointing_enable", "activation_checkpointing_enable", "gradient_checkpointing") + CALL_WORDS,
    triggers=(HF_SWITCH, LIBRARY_SWITCH, PEFT_ENTRY, TRL_ENTRY))

COMPILED_CALL_IN_THREAD = declare(Rule(
    code="DFD201",
    name="compiled-call-in-thread",
    severity=Severity.ERROR,
    summary="a thread runs a torch.compile'd callable",
    rationale=(
        "Every call of a torch.compile'd function checks a process-global FX-tracing flag (module global up to "
        "torch 2.13) that any other thread's compile sets while it traces. A worker thread calling compiled code "
        "while another thread compiles raises 'Detected that you are using FX to symbolically trace a "
        "dynamo-optimized function', or deadlocks on Dynamo's compile lock against the autograd device thread. "
        "The call chain is followed across the scanned modules, through constructor arguments stored on self, "
        "containers, properties and decorators rebound to torch.compile. When the thread's program (its entry "
        "point: a __main__ guard, a named file, a console script or a declared entry point, and the project "
        "files it imports) applies fixes that together stop every hazard of that program (the mitigation "
        "registry's markers, e.g. runtime.install_threadlocal_fx_flag() with runtime.enable_non_lazy_backward(); "
        "the FX patcher race too where a thread traces with FX, DFD203), the finding is info, 'mitigated by ...' "
        "naming where the fixes are and the program; a partial fix keeps it an error and says what it leaves "
        "open, and a fix in another program, or a per-thread switch the worker never enters, does not count."
    ),
    fix=(
        "Warm every shape and device in one thread before starting workers, serialise compiled steps with one "
        "global lock, or run workers as processes; `dflash-doctor repro --matrix` shows which works here."
    ),
    bad=(
        "import threading\n"
        "import torch\n"
        "\n"
        "attn = torch.compile(lambda q, k: q @ k.T)\n"
        "\n"
        "def worker(q, k):\n"
        "    return attn(q, k)\n"
        "\n"
        "threading.Thread(target=worker, args=(1, 2)).start()  # DFD201\n"
    ),
    good=(
        "import torch\n"
        "\n"
        "attn = torch.compile(lambda q, k: q @ k.T)\n"
        "\n"
        "def worker(q, k):\n"
        "    return attn(q, k)\n"
        "\n"
        "worker(1, 2)\n"
    ),
), checks=("threads.SpawnCollector", "fixes.FixCollector"),
    words=("Thread", "Timer", "ThreadPoolExecutor", "ThreadPool", "Pool") + MITIGATION_MARKERS,
    triggers=(THREAD_SPAWN, APPLIED_MITIGATION),
    # a compiled call in a worker: the FX flag leak, the stuck flag and the compile-lock deadlock (docs/races.md)
    hazards=frozenset({Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG, Hazard.DEADLOCK}))

FLEX_ATTENTION_UNCOMPILED = declare(Rule(
    code="DFD202",
    name="flex-attention-uncompiled",
    severity=Severity.WARNING,
    summary="flex_attention called directly, outside any compiled function",
    rationale=(
        "Uncompiled, flex_attention runs its dense reference path, which materialises the full QK^T score "
        "matrix: slow, and out of memory at training lengths. Call it through torch.compile. Coverage is decided "
        "project-wide: a layer that another scanned module compiles (torch.compile(Layer()), a model whose blocks "
        "call it, an aot_compile entry point) is not reported."
    ),
    fix="flex = torch.compile(flex_attention) once at module level, then call flex(...).",
    bad=(
        "from torch.nn.attention.flex_attention import flex_attention\n"
        "\n"
        "def attend(q, k, v, block_mask):\n"
        "    return flex_attention(q, k, v, block_mask=block_mask)  # DFD202\n"
    ),
    good=(
        "import torch\n"
        "from torch.nn.attention.flex_attention import flex_attention\n"
        "\n"
        "compiled_flex = torch.compile(flex_attention)\n"
        "\n"
        "def attend(q, k, v, block_mask):\n"
        "    return compiled_flex(q, k, v, block_mask=block_mask)\n"
    ),
), checks=("flex.FlexAttentionRule",),
    words=("flex_attention",), triggers=(FLEX_CALL,))

_PATCHER_FIXES = tuple(m.name for m in REGISTRY if Hazard.PATCHER_RACE in m.covers and m.recommended)

FX_TRACE_IN_THREAD = declare(Rule(
    code="DFD203",
    name="fx-trace-in-thread",
    severity=Severity.ERROR,
    summary="an FX trace runs while other threads run: torch.fx patches nn.Module for every thread",
    rationale=(
        "torch.fx's Tracer.trace (behind torch.fx.symbolic_trace, Tracer().trace, every Tracer subclass and "
        "make_fx) replaces torch.nn.Module.__call__ and __getattr__ on the classes, so for every thread, and keeps "
        "the active patcher in the module global CURRENT_PATCHER (torch 2.13, 2.14.1 and 2.15.0 alike). While one "
        "thread traces, an eager module call in another thread raises 'NameError: module is not installed as a "
        "submodule'; two traces that overlap end in 'AssertionError: CURRENT_PATCHER is None in finally block'. "
        "Reported where a thread's target reaches such a trace (the call chain is followed across the scanned "
        "modules and Tracer subclasses' bases), and where code that started threads traces before joining them. "
        "A trainer with such a trace is mitigated only by fixes that also stop this race: the thread-local FX flag "
        "and non-lazy backward do not touch it."
    ),
    fix=("Trace before the workers start or after they join, or hold the workers' lock while tracing"
         + (f"; or apply {', '.join(_PATCHER_FIXES)} (`dflash-doctor explain mitigations`)" if _PATCHER_FIXES
            else "") + "."),
    bad=(
        "import threading\n"
        "import torch.fx\n"
        "\n"
        "def profile(model):\n"
        "    return torch.fx.symbolic_trace(model)\n"
        "\n"
        "threading.Thread(target=profile, args=(None,)).start()  # DFD203\n"
    ),
    good=(
        "import threading\n"
        "import torch.fx\n"
        "\n"
        "def profile(model):\n"
        "    return torch.fx.symbolic_trace(model)\n"
        "\n"
        "graph = profile(None)\n"
        "threading.Thread(target=print, args=(graph,)).start()\n"
    ),
), checks=("threads.SpawnCollector", "threads.TraceCollector"),
    words=("Thread", "Timer", "ThreadPoolExecutor", "ThreadPool", "Pool", "symbolic_trace", "make_fx", "trace"),
    triggers=(THREAD_SPAWN,),
    hazards=frozenset({Hazard.PATCHER_RACE}))

NESTED_FX_TRACE_SILENCED = declare(Rule(
    code="DFD301",
    name="nested-fx-trace-silenced",
    severity=Severity.WARNING,
    summary="the nested-FX-trace error is switched off: the race now runs uncompiled code silently",
    rationale=(
        "With error_on_nested_fx_trace=False (or force_compile_during_fx_trace=True) the guard no longer raises: "
        "a call that hits the race silently runs the uncompiled function (for flex_attention, the dense path that "
        "can OOM) or compiles inside another thread's trace. The race is still there, only hidden."
    ),
    fix="Leave both at their defaults and remove the race (see `dflash-doctor repro --matrix`).",
    bad=(
        "import torch._dynamo\n"
        "\n"
        "torch._dynamo.config.error_on_nested_fx_trace = False  # DFD301\n"
    ),
    good=(
        "import torch._dynamo\n"
        "\n"
        "torch._dynamo.config.cache_size_limit = 64\n"
    ),
), checks=("dynamo_config.DynamoConfigRule",),
    words=("error_on_nested_fx_trace", "force_compile_during_fx_trace"), triggers=(DYNAMO_CONFIG_KEY,))

UNUSED_NOQA = declare(Rule(
    code="DFD302",
    name="unused-noqa",
    severity=Severity.INFO,
    summary="a `# noqa: DFDxxx` comment that suppresses nothing",
    rationale=(
        "A noqa comment outlives the code it was written for: once the line is fixed or moved, it silences "
        "nothing, and later it hides a new finding nobody has looked at. Like ruff's RUF100, the scan reports "
        "each DFD code in a noqa comment that no finding on that line needed (only for the rules that ran). "
        "Bare `# noqa` and other tools' codes are left alone."
    ),
    fix="Delete the code from the comment (or the whole comment when nothing is left).",
    bad=(
        "from torch.utils.checkpoint import checkpoint\n"
        "\n"
        "def block(layer, h):\n"
        "    return checkpoint(layer, h, use_reentrant=False)  # noqa: DFD102  # DFD302\n"
    ),
    good=(
        "from torch.utils.checkpoint import checkpoint\n"
        "\n"
        "def block(layer, h):\n"
        "    return checkpoint(layer, h)  # noqa: DFD102\n"
    ),
), after_files=True)

COMPILED_MODULE_IN_DATA_PARALLEL = declare(Rule(
    code="DFD204",
    name="compiled-module-in-data-parallel",
    severity=Severity.ERROR,
    summary="nn.DataParallel (or parallel_apply) runs a torch.compile'd module in a thread per replica",
    rationale=(
        "nn.DataParallel replicates its module on every forward and runs each replica's forward in a thread of "
        "its own (torch.nn.parallel.parallel_apply), re-raising a replica's exception in the caller as 'Caught "
        "<Error> in replica N on device D'. nn.DataParallel(torch.compile(model)) failed at its first step on one "
        "H100 (torch 2.11: InternalTorchDynamoError in replica 0, a RecursionError in Dynamo's guard building): "
        "replicating the compiled wrapper assigns the replica's _parameters and _modules through "
        "OptimizedModule.__setattr__, which forwards them to the user's own model, emptying it (read in the 2.11 "
        "to 2.15 sources, measured on 2.13 and 2.14.1; docs/races.md): an error. A model whose forward calls "
        "compiled code (a compiled flex_attention inside) and parallel_apply over modules compiled one per "
        "replica ran: a warning, since the compiled calls still run in the replica threads, where the thread "
        "races of DFD201 apply and a first call made by every replica at once compiles once per thread "
        "(AnswerDotAI/ModernBERT#147 hit the FX-tracing RuntimeError under DataParallel; pytorch/pytorch#94636, "
        "huggingface/transformers#22326). torch.compile(nn.DataParallel(model)) is not reported: it ran, although "
        "on 2.13 it compiled no graph in the replicas. Reported where the module is wrapped, with the call chain "
        "to the compiled code."
    ),
    fix=dataparallel.fix_text(),
    bad=(
        "import torch\n"
        "from torch import nn\n"
        "\n"
        "model = torch.compile(nn.Linear(8, 8))\n"
        "replicas = nn.DataParallel(model, device_ids=[0, 1])  # DFD204\n"
    ),
    good=(
        "import torch\n"
        "from torch import nn\n"
        "\n"
        "model = nn.Linear(8, 8)\n"
        "replicas = torch.compile(nn.DataParallel(model, device_ids=[0, 1]))\n"
    ),
), checks=("threads.SpawnCollector",),
    words=("DataParallel", "parallel_apply", "data_parallel", "compile"),
    triggers=(DATA_PARALLEL_CALL,))

HF_TRAINER_COMPILE_DATA_PARALLEL = declare(Rule(
    code="DFD205",
    name="hf-trainer-compile-data-parallel",
    severity=Severity.WARNING,
    summary="a Hugging Face training configuration with torch_compile=True: under DataParallel without a launcher",
    rationale=(
        "Started as a plain `python train.py` on a machine with several visible GPUs, the Hugging Face Trainer "
        "wraps the model in nn.DataParallel, whose replica threads run it (DFD204). With torch_compile=True that "
        "run failed in public reports (huggingface/transformers#22326) or silently trained uncompiled (#25152, "
        "#34656; the maintainers' answer: launch with accelerate). With one process per GPU (torchrun, accelerate "
        "launch, deepspeed) the Trainer uses DistributedDataParallel instead and no replica threads exist. "
        "Reported on TrainingArguments and the TRL and sentence-transformers configurations that extend it, and on "
        "a Trainer of those libraries handed a torch.compile'd model (replicated by DataParallel: the form that "
        "failed, DFD204); not in a file that reads a launcher's LOCAL_RANK or WORLD_SIZE or calls "
        "init_process_group itself."
    ),
    fix=("Launch one process per GPU: torchrun --nproc_per_node N train.py or accelerate launch train.py (or "
         "restrict the run to one GPU with CUDA_VISIBLE_DEVICES)."),
    bad=(
        "from transformers import TrainingArguments\n"
        "\n"
        'args = TrainingArguments(output_dir="out", torch_compile=True)  # DFD205\n'
    ),
    good=(
        "import os\n"
        "from transformers import TrainingArguments\n"
        "\n"
        'assert "LOCAL_RANK" in os.environ, "start with torchrun --nproc_per_node N"\n'
        'args = TrainingArguments(output_dir="out", torch_compile=True)\n'
    ),
), checks=("trainer_compile.TrainerCompileRule",), words=("torch_compile", "Trainer"), triggers=(TRAINER_COMPILE,))

_SETTING_KEYS = tuple(sorted({setting.key for setting in SETTINGS}))
# A setting named in a file that starts threads or DataParallel's replica threads. The words are those of the spawn
# triggers, searched already for DFD201 and DFD204 (a word a file lacks is not searched twice), and the setting's
# name is looked for in the few files that have one (which assignments count is the check's business).
# The settings' names, shortened where one name holds another (`accumulated_recompile_limit`, both FX-trace keys)
_SETTING_WORDS = (b"recompile_limit", b"cache_size_limit", b"force_non_lazy_backward_lowering", b"_fx_trace")
assert all(any(word in key.encode() for word in _SETTING_WORDS) for key in _SETTING_KEYS)
COMPILE_SETTING_IN_THREADS = ByteTrigger(THREAD_SPAWN.words, THREAD_SPAWN.near, anywhere_words=_SETTING_WORDS)
COMPILE_SETTING_IN_REPLICAS = ByteTrigger(DATA_PARALLEL_CALL.words, DATA_PARALLEL_CALL.near,
                                          anywhere_words=_SETTING_WORDS)

COMPILE_SETTING_NOT_IN_THREADS = declare(Rule(
    code="DFD303",
    name="compile-setting-not-in-threads",
    severity=Severity.WARNING,
    summary="a compile setting assigned in one thread and relied on in threads started later (per thread from 2.12)",
    rationale=(
        "From torch 2.12, a value assigned to torch._dynamo.config, torch._inductor.config or "
        "torch._functorch.config lives in a ContextVar of the assigning thread (pytorch/pytorch#186537): a thread "
        "started later begins with an empty context and reads the default. Measured on torch 2.13: "
        "force_non_lazy_backward_lowering set in the main thread reads False in a worker, whose backward still "
        "compiles lazily; error_on_nested_fx_trace set to False in main reads True there; a recompile limit "
        "raised in main is ignored in a ThreadPoolExecutor worker (mstar-project/mstar#167). On 2.11 and earlier "
        "the same assignment reached every thread. Reported at the assignment of a setting listed in "
        "dflash_doctor/compile_settings.py (the value a user relies on: a True non-lazy switch, the value that "
        "silences the FX error, any recompile limit) when threads started in the same file run compiled code and "
        "neither assign it themselves nor enter the tool's per-thread form (a `with dflash_doctor.runtime...` "
        "in what the thread runs)."
    ),
    fix=("Assign the setting inside each thread that compiles (first thing in its target), or use the tool's "
         "runtime API, which carries it into the threads (`dflash-doctor explain mitigations`)."),
    bad=(
        "import threading\n"
        "import torch\n"
        "import torch._dynamo\n"
        "\n"
        "torch._dynamo.config.recompile_limit = 64  # DFD303\n"
        "step = torch.compile(lambda x: x * 2)\n"
        "\n"
        "\n"
        "def worker(x):\n"
        "    return step(x)\n"
        "\n"
        "\n"
        "threading.Thread(target=worker, args=(1,)).start()  # noqa: DFD201 (the race has its own rule)\n"
    ),
    good=(
        "import torch\n"
        "import torch._dynamo\n"
        "\n"
        "torch._dynamo.config.recompile_limit = 64\n"
        "step = torch.compile(lambda x: x * 2)\n"
        "step(1)\n"
    ),
), checks=("threads.SpawnCollector", "settings_reach.SettingCollector"),
    words=("Thread", "Timer", "ThreadPoolExecutor", "ThreadPool", "Pool", "DataParallel", "parallel_apply",
           "data_parallel", "setattr", "runtime", "dflash_doctor") + _SETTING_KEYS,
    triggers=(COMPILE_SETTING_IN_THREADS, COMPILE_SETTING_IN_REPLICAS))
