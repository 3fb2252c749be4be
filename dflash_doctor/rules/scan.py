"""Static-scan rules (DFD1xx checkpointing, DFD2xx threads and compile, DFD3xx configuration)."""
from dflash_doctor.findings import Severity
from dflash_doctor.rules.registry import Rule, register

CHECKPOINT_USE_REENTRANT_TRUE = register(Rule(
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
        "Hugging Face's gradient_checkpointing_kwargs as a keyword, an attribute, a subscript or a config dict. A "
        "name is judged on every value it is bound to in its scope, so a default of True on one path counts."
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
))

CHECKPOINT_USE_REENTRANT_IMPLICIT = register(Rule(
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
))

CHECKPOINT_USE_REENTRANT_UNKNOWN = register(Rule(
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
))

HF_GRADIENT_CHECKPOINTING_IMPLICIT = register(Rule(
    code="DFD104",
    name="hf-gradient-checkpointing-implicit",
    severity=Severity.WARNING,
    summary="Hugging Face gradient checkpointing enabled without use_reentrant (reentrant on transformers 4.x)",
    rationale=(
        "Hugging Face models forward gradient_checkpointing_kwargs to torch.utils.checkpoint. Left out (a bare "
        "gradient_checkpointing_enable(), or TrainingArguments/TRL configs with gradient_checkpointing=True and no "
        "kwargs, which Trainer passes on as None), every transformers release before 5.0 checkpoints with the "
        "reentrant variant: 4.38-4.57 pass use_reentrant=True, 4.35-4.37 and older leave torch's reentrant "
        "default; 5.0 made use_reentrant=False the default. Kwargs given without use_reentrant reach torch's own "
        "default, the reentrant variant, on every release. The message names the installed transformers release "
        "when there is one (read from package metadata, never imported); on 5.0 or later the finding is info."
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
))

COMPILED_CALL_IN_THREAD = register(Rule(
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
        "containers and decorators rebound to torch.compile. When the scanned program applies fixes that together "
        "stop every hazard (the mitigation registry's markers, e.g. runtime.install_threadlocal_fx_flag() with "
        "runtime.enable_non_lazy_backward()), the finding is info, 'mitigated by ...'; a partial fix keeps it an "
        "error and says what it leaves open."
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
))

FLEX_ATTENTION_UNCOMPILED = register(Rule(
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
))

NESTED_FX_TRACE_SILENCED = register(Rule(
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
))

UNUSED_NOQA = register(Rule(
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
))
