"""Guards rules (DFD6xx): what `dflash-doctor guards` finds in the installed torch and in the running process.

Examples come in two formats, both run as tests through `dflash_doctor.guards.findings_for_example`:
- torch-layout: stand-in torch sources, several files in one text, each after a `# ==> PATH <==` header (PATH
  relative to the torch package). They are small modules shaped like a release's code, not torch's code.
- guards-state: a JSON object with the `guards` facts keys the rule reads (fx_flag_now, config, compile_cache,
  env, probes).
"""
from dflash_doctor.findings import Severity
from dflash_doctor.mitigations import RESTART, RESTORE_CONFIG, fix_text
from dflash_doctor.hazards import Hazard
from dflash_doctor.rules.registry import Rule, register

_FLAG_FIX = fix_text(Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG)

_WRAPPER = (
    "# ==> _dynamo/eval_frame.py <==\n"
    "import torch\n"
    "from . import config\n"
    "\n"
    "\n"
    "def wrap(fn):\n"
    "    is_fx_symbolic_tracing = torch.fx._symbolic_trace.is_fx_symbolic_tracing\n"
    "\n"
    "    def compile_wrapper(*args, **kwargs):\n"
    "        if is_fx_symbolic_tracing() and not config.force_compile_during_fx_trace:\n"
    "            if config.error_on_nested_fx_trace:\n"
    "                raise RuntimeError(\"Detected that you are using FX to symbolically trace a dynamo-optimized "
    "function.\")\n"
    "        return fn(*args, **kwargs)\n"
    "\n"
    "    return compile_wrapper\n"
    "\n"
)

_THREAD_LOCAL_FX_FLAG = (
    "# ==> fx/_symbolic_trace.py <==\n"
    "import threading\n"
    "\n"
    "import torch\n"
    "\n"
    "_is_fx_tracing_tls = threading.local()\n"
    "\n"
    "\n"
    "def is_fx_symbolic_tracing():\n"
    "    return getattr(_is_fx_tracing_tls, \"flag\", False) and not torch.compiler.is_compiling()\n"
    "\n"
    "\n"
    "class Tracer:\n"
    "    def trace(self, root):\n"
    "        _is_fx_tracing_tls.flag = True\n"
    "        try:\n"
    "            return root\n"
    "        finally:\n"
    "            _is_fx_tracing_tls.flag = False\n"
    "\n"
)

_COMPILE_HOLDS_THE_FLAG = (
    "# ==> _dynamo/convert_frame.py <==\n"
    "import torch\n"
    "\n"
    "\n"
    "def _compile(code):\n"
    "    with torch.compiler._compile_session_context():\n"
    "        return code\n"
)

FX_FLAG_MODULE_GLOBAL = register(Rule(
    code="DFD601",
    name="fx-flag-module-global",
    severity=Severity.ERROR,
    summary="the FX-tracing flag that every compiled call checks is a module global shared by all threads",
    rationale=(
        "Every call of a torch.compile'd function runs compile_wrapper's guard, which raises 'Detected that you "
        "are using FX to symbolically trace a dynamo-optimized function' when the FX-tracing predicate is true. "
        "Here that predicate reads a module global that Tracer.trace sets: while any thread traces (symbolic_trace, "
        "or make_fx inside another thread's compile or lazy backward compile), every other thread's compiled "
        "calls raise. Its save/set/restore also sticks at True when two traces exit out of order, after which "
        "every compiled call in the process raises (torch 2.4-2.13 as read; 2.14 made it thread-local)."
    ),
    fix=_FLAG_FIX,
    example_format="torch-layout",
    bad=(
        _WRAPPER
        + "# ==> fx/_symbolic_trace.py <==\n"
        "import torch\n"
        "\n"
        "_is_fx_tracing_flag = False  # DFD601\n"
        "\n"
        "\n"
        "def is_fx_symbolic_tracing():\n"
        "    return _is_fx_tracing_flag and not torch.compiler.is_compiling()\n"
        "\n"
        "\n"
        "class Tracer:\n"
        "    def trace(self, root):\n"
        "        global _is_fx_tracing_flag\n"
        "        saved = _is_fx_tracing_flag\n"
        "        _is_fx_tracing_flag = True\n"
        "        try:\n"
        "            return root\n"
        "        finally:\n"
        "            _is_fx_tracing_flag = saved\n"
    ),
    good=_WRAPPER + _THREAD_LOCAL_FX_FLAG.rstrip("\n") + "\n",
))

FX_FLAG_STUCK = register(Rule(
    code="DFD602",
    name="fx-flag-set-at-rest",
    severity=Severity.ERROR,
    summary="the FX-tracing flag is True outside any trace: this process's compiled calls all raise from now on",
    rationale=(
        "Two FX traces in different threads exited out of order (A enters, B enters, A leaves, B leaves): B "
        "restored the value it saw on entry, True. The flag never clears by itself, so every later call of any "
        "compiled function, in any thread, raises the nested-FX-trace RuntimeError: the 'Dynamo state globally "
        "corrupted' symptom. Only a restart recovers."
    ),
    fix=f"{RESTART.fix} Then remove the race: {_FLAG_FIX}",
    example_format="guards-state",
    bad='{"fx_flag_now": true}\n',
    good='{"fx_flag_now": false}\n',
))

NESTED_FX_TRACE_ERROR_DISABLED = register(Rule(
    code="DFD603",
    name="fx-trace-error-disabled",
    severity=Severity.WARNING,
    summary="Dynamo's nested-FX-trace error is switched off in this process: the race now runs uncompiled code",
    rationale=(
        "With torch._dynamo.config.error_on_nested_fx_trace = False the guard returns the *uncompiled* function "
        "instead of raising, and with force_compile_during_fx_trace = True it compiles inside another thread's "
        "trace. Either hides the race: for flex_attention the uncompiled path is the dense one, which "
        "materialises QK^T and can run out of memory far from the cause."
    ),
    fix=RESTORE_CONFIG.fix,
    example_format="guards-state",
    bad='{"config": {"error_on_nested_fx_trace": false, "force_compile_during_fx_trace": false}}\n',
    good='{"config": {"error_on_nested_fx_trace": true, "force_compile_during_fx_trace": false}}\n',
))

COMPILE_CACHE_COLD = register(Rule(
    code="DFD604",
    name="compile-cache-cold",
    severity=Severity.INFO,
    summary="the inductor compile cache is empty or disabled: every first step traces with make_fx",
    rationale=(
        "A warm inductor cache (TORCHINDUCTOR_CACHE_DIR, default /tmp/torchinductor_$USER) lets a compile skip "
        "make_fx, and with it the window in which the FX-tracing flag is set. The seeds' pipeline only broke "
        "after its 353 MB, 285-entry cache was deleted. A cold or disabled cache makes that window open on every "
        "first step of every shape."
    ),
    fix="Keep TORCHINDUCTOR_CACHE_DIR on persistent storage and warm it in one thread; it narrows the window, it "
        "does not close the race.",
    example_format="guards-state",
    bad='{"compile_cache": {"dir": "/tmp/torchinductor_alice", "exists": false, "bytes": 0, "entries": 0}}\n',
    good='{"compile_cache": {"dir": "/data/inductor-cache", "exists": true, "bytes": 370147328, "entries": 285}}\n',
))

COMPILING_FLAG_PROCESS_GLOBAL = register(Rule(
    code="DFD605",
    name="compiling-flag-process-global",
    severity=Severity.WARNING,
    summary="Dynamo compiles set a process-global 'compiling' flag that every thread sees",
    rationale=(
        "From torch 2.13 each Dynamo compile holds torch.compiler's compiling flag True for the whole compile, "
        "and the FX guard is masked while it is set. The flag is a module global, so during one thread's compile "
        "torch.compiler.is_compiling() is True in every thread: code that branches on it (skipping checks, "
        "choosing kernels, the FX guard itself) behaves in other threads as if it were being compiled."
    ),
    fix=fix_text(Hazard.IS_COMPILING_LEAK),
    example_format="torch-layout",
    bad=(
        _WRAPPER
        + _THREAD_LOCAL_FX_FLAG
        + "# ==> compiler/__init__.py <==\n"
        "import contextlib\n"
        "\n"
        "_is_compiling_flag = False  # DFD605\n"
        "\n"
        "\n"
        "def is_compiling():\n"
        "    return _is_compiling_flag\n"
        "\n"
        "\n"
        "@contextlib.contextmanager\n"
        "def _compile_session_context():\n"
        "    global _is_compiling_flag\n"
        "    saved = _is_compiling_flag\n"
        "    _is_compiling_flag = True\n"
        "    try:\n"
        "        yield\n"
        "    finally:\n"
        "        _is_compiling_flag = saved\n"
        "\n"
        + _COMPILE_HOLDS_THE_FLAG
    ),
    good=(
        _WRAPPER
        + _THREAD_LOCAL_FX_FLAG
        + "# ==> compiler/__init__.py <==\n"
        "import contextlib\n"
        "import threading\n"
        "\n"
        "_compiling = threading.local()\n"
        "\n"
        "\n"
        "def is_compiling():\n"
        "    return getattr(_compiling, \"active\", False)\n"
        "\n"
        "\n"
        "@contextlib.contextmanager\n"
        "def _compile_session_context():\n"
        "    _compiling.active = True\n"
        "    try:\n"
        "        yield\n"
        "    finally:\n"
        "        _compiling.active = False\n"
        "\n"
        + _COMPILE_HOLDS_THE_FLAG
    ),
))

# A live probe's finding: its Probe (guards/probes.py) carries the rule, and the example is that probe's outcome.
PROBE_CROSS_THREAD_LEAK = register(Rule(
    code="DFD606",
    name="probe-cross-thread-leak",
    severity=Severity.ERROR,
    summary="reproduced: a compiled call raised in one thread while another thread was inside an FX trace",
    rationale=(
        "The probe ran, in a child process, torch.fx.symbolic_trace in thread A on a module whose forward waits, "
        "and called an already compiled function (backend='eager') in thread B meanwhile. B raised the "
        "nested-FX-trace RuntimeError: with this torch, one thread's trace breaks other threads' compiled code."
    ),
    fix=_FLAG_FIX,
    example_format="guards-state",
    bad='{"probes": {"cross_thread_leak": "reproduced"}}\n',
    good='{"probes": {"cross_thread_leak": "not-reproduced"}}\n',
))

PROBE_STUCK_FLAG = register(Rule(
    code="DFD607",
    name="probe-stuck-flag",
    severity=Severity.ERROR,
    summary="reproduced: two FX traces that exit out of order leave the flag stuck and compiled calls raising",
    rationale=(
        "The probe ran, in a child process, trace A then trace B in two threads, let A finish before B, and then "
        "called a compiled function with no trace running: it raised. With this torch a process in which traces "
        "overlap can be left permanently unable to run compiled code."
    ),
    fix=f"{_FLAG_FIX} A process already in that state: {RESTART.fix}",
    example_format="guards-state",
    bad='{"probes": {"stuck_flag": "reproduced"}}\n',
    good='{"probes": {"stuck_flag": "not-reproduced"}}\n',
))

PROBE_IS_COMPILING_LEAK = register(Rule(
    code="DFD608",
    name="probe-is-compiling-leak",
    severity=Severity.WARNING,
    summary="reproduced: another thread sees torch.compiler.is_compiling() True while one thread compiles",
    rationale=(
        "The probe held a compile inside a custom backend in thread A and asked torch.compiler.is_compiling() "
        "in thread B: True. See DFD605 for what that changes in other threads."
    ),
    fix=fix_text(Hazard.IS_COMPILING_LEAK),
    example_format="guards-state",
    bad='{"probes": {"is_compiling_leak": "reproduced"}}\n',
    good='{"probes": {"is_compiling_leak": "not-reproduced"}}\n',
))

_DYNAMO_COMPILE_HOLDS_THE_LOCK = (
    "# ==> _dynamo/convert_frame.py <==\n"
    "import threading\n"
    "\n"
    "compile_lock = threading.RLock()\n"
    "\n"
    "\n"
    "def convert_frame(frame):\n"
    "    with compile_lock:\n"
    "        return frame\n"
    "\n"
)

_LAZY_BACKWARD = (
    "# ==> _functorch/_aot_autograd/runtime_wrappers.py <==\n"
    "class BackwardCompiler:\n"
    "    def __init__(self, bw_compiler, bw_module):\n"
    "        self.bw_compiler = bw_compiler\n"
    "        self.bw_module = bw_module\n"
    "        self.compiled_bw = None\n"
    "\n"
    "    def get_or_compile(self, placeholders):\n"
    "        if self.compiled_bw is None:\n"
    "            self.compiled_bw = self.bw_compiler(self.bw_module, placeholders)\n"
    "        return self.compiled_bw\n"
)

BACKWARD_COMPILE_TAKES_COMPILE_LOCK = register(Rule(
    code="DFD609",
    name="backward-compile-takes-compile-lock",
    severity=Severity.ERROR,
    summary="the lazy backward compile takes Dynamo's compile_lock: threads can deadlock on the autograd thread",
    rationale=(
        "AOTAutograd compiles a compiled function's backward lazily, when its first backward runs, on the thread "
        "that runs it: for GPU tensors, the autograd engine's device thread. From torch 2.6 inductor's backward "
        "compiler takes torch._dynamo.convert_frame.compile_lock (bw_compiler in 2.6-2.8, compile_fx_backward from "
        "2.9). A second thread compiling under that lock, whose joint trace calls torch.autograd.grad, waits for "
        "the same device thread: neither moves and nothing raises. Three threads of compiled flex_attention "
        "forward+backward on one H200 (torch 2.11) hung this way every time. torch 2.4 and 2.5 take no lock there."
    ),
    fix=fix_text(Hazard.DEADLOCK),
    example_format="torch-layout",
    bad=(
        _DYNAMO_COMPILE_HOLDS_THE_LOCK
        + "# ==> _inductor/compile_fx.py <==\n"
        "def compile_fx_backward(gm, example_inputs):\n"
        "    from torch._dynamo.convert_frame import compile_lock\n"
        "\n"
        "    with compile_lock:  # DFD609\n"
        "        return gm\n"
        "\n"
        "\n"
        "def compile_fx(model, example_inputs, aot_autograd):\n"
        "    def bw_compiler(gm, example_inputs):\n"
        "        return compile_fx_backward(gm, example_inputs)\n"
        "\n"
        "    return aot_autograd(bw_compiler=bw_compiler)(model, example_inputs)\n"
        "\n"
        + _LAZY_BACKWARD
    ),
    good=(
        _DYNAMO_COMPILE_HOLDS_THE_LOCK
        + "# ==> _inductor/compile_fx.py <==\n"
        "def compile_fx(model, example_inputs, aot_autograd, inner_compile):\n"
        "    def bw_compiler(gm, example_inputs):\n"
        "        return inner_compile(gm, example_inputs, is_backward=True)\n"
        "\n"
        "    return aot_autograd(bw_compiler=bw_compiler)(model, example_inputs)\n"
        "\n"
        + _LAZY_BACKWARD
    ),
))

PROBE_PATCHER_RACE = register(Rule(
    code="DFD610",
    name="probe-fx-patcher-race",
    severity=Severity.WARNING,
    summary="reproduced: an eager module call raised NameError in one thread while another thread was inside "
            "symbolic_trace (only where a thread runs its own FX trace)",
    rationale=(
        "The probe ran, in a child process, torch.fx.symbolic_trace in thread A on a module whose forward waits, "
        "and called a plain eager torch.nn.Linear in thread B meanwhile. B raised 'NameError: module is not "
        "installed as a submodule': Tracer.trace replaces nn.Module.__call__ and __getattr__ on the classes, for "
        "every thread, and keeps its patcher in the module global CURRENT_PATCHER, so two overlapping traces also "
        "end in 'AssertionError: CURRENT_PATCHER is None in finally block'. It needs a thread that runs its own "
        "FX trace (a profiler, a graph inspection, a Tracer subclass) beside threads that run modules; compiles "
        "alone do not trip it. It is a warning, not an error, for that reason."
    ),
    fix=fix_text(Hazard.PATCHER_RACE),
    example_format="guards-state",
    bad='{"probes": {"patcher_race": "reproduced"}}\n',
    good='{"probes": {"patcher_race": "not-reproduced"}}\n',
))

_CONFIG_ENTRY = (
    "# ==> utils/_config_module.py <==\n"
    "from contextvars import ContextVar\n"
    "\n"
    "_UNSET = object()\n"
    "\n"
    "\n"
    "class _ConfigEntry:\n"
    "    def __init__(self, name, default):\n"
    "        self.default = default\n"
)

COMPILE_SETTINGS_PER_THREAD = register(Rule(
    code="DFD611",
    name="compile-settings-per-thread",
    severity=Severity.WARNING,
    summary="this release keeps compile settings per thread: a setting assigned in the main thread never reaches "
            "the worker threads",
    rationale=(
        "ConfigModule.__setattr__ (what `torch._functorch.config.force_non_lazy_backward_lowering = True`, "
        "`torch._dynamo.config.error_on_nested_fx_trace = False` or `recompile_limit = 64` run) stores the value "
        "in a ContextVar here (torch 2.12 and later as read). A thread started later begins with an empty context "
        "and reads the default. So the deadlock fix set once in main leaves every worker compiling its backward "
        "lazily (measured on torch 2.13: the worker's backward still compiled at its first backward()), silencing "
        "the FX error in main does not silence a worker, and a recompile limit raised in main leaves the workers "
        "at the default. On 2.11 and earlier the same assignment reached every thread."
    ),
    fix=("Apply a config-based fix so it reaches every worker: `dflash_doctor.runtime.enable_non_lazy_backward()` "
         "before the workers start (it also sets the switch in every thread started later, ThreadPoolExecutor and "
         "DataParallel threads included), or `with dflash_doctor.runtime.non_lazy_backward_in_thread():` in each "
         "worker; `dflash-doctor run --fix non-lazy-backward` does the former for an unmodified trainer. Set any "
         "other compile setting inside each thread that compiles."),
    example_format="torch-layout",
    bad=(
        _CONFIG_ENTRY
        + "        self.user_override = ContextVar(name, default=_UNSET)\n"
        "\n"
        "\n"
        "class ConfigModule:\n"
        "    def __setattr__(self, name, value):\n"
        "        entry = self._config[name]\n"
        "        entry.user_override.set(value)  # DFD611\n"
    ),
    good=(
        _CONFIG_ENTRY
        + "        self.user_override = _UNSET\n"
        "\n"
        "\n"
        "class ConfigModule:\n"
        "    def __setattr__(self, name, value):\n"
        "        self._config[name].user_override = value\n"
    ),
))
