"""The layout analyzer on stand-in layouts of each release family, and on the resolution shapes they vary in."""
from __future__ import annotations

from pathlib import Path

import pytest

from dflash_doctor.guards import read_layout, read_layout_text
from dflash_doctor.guards.verdict import decide_hazards, headline

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "guards"


@pytest.mark.parametrize(
    "folder, version, function, predicate, storage, flag, consults, compiling_storage, masked, verdict",
    [
        ("torch-2.4", "2.4.1", "_fn", "is_fx_tracing", "module-global", "_is_fx_tracing_flag", False, "module-global",
         False, "vulnerable"),
        ("torch-2.6", "2.6.0+cu124", "_fn", "is_fx_tracing", "module-global", "_is_fx_tracing_flag", False,
         "module-global", False, "vulnerable"),
        ("torch-2.11", "2.11.0+cu130", "compile_wrapper", "is_fx_symbolic_tracing", "module-global",
         "_is_fx_tracing_flag", True, "module-global", False, "vulnerable"),
        ("torch-2.13", "2.13.0+cpu", "compile_wrapper", "is_fx_symbolic_tracing", "module-global",
         "_is_fx_tracing_flag", True, "module-global", True, "vulnerable"),
        ("torch-2.14", "2.14.1+cu130", "compile_wrapper", "is_fx_symbolic_tracing", "thread-local",
         "_is_fx_tracing_tls", True, "module-global", True, "vulnerable"),
        ("torch-unknown", "9.9.0a0+unknown", "compile_wrapper", "is_fx_symbolic_tracing", "unknown", None, True,
         "module-global", False, "unknown"),
    ],
)
def test_stand_in_layouts(folder, version, function, predicate, storage, flag, consults, compiling_storage, masked,
                          verdict):
    layout = read_layout(FIXTURES / folder)
    assert layout.torch_version == version
    assert layout.guard.function == function
    assert layout.guard.predicate == predicate
    assert layout.guard.predicate_qualname == f"torch.fx._symbolic_trace.{predicate}"
    assert layout.guard.bound_at_wrap is True
    assert layout.fx_flag_storage == storage
    assert (layout.fx_flag.name if layout.fx_flag else None) == flag
    assert layout.consults_is_compiling is consults
    assert (layout.compiling_flag.storage if layout.compiling_flag else None) == compiling_storage
    assert layout.masked_during_compile is masked
    assert headline(decide_hazards(layout, {}, None))[0] == verdict


def test_guard_line_is_the_raise_and_its_source_is_the_if_block():
    layout = read_layout(FIXTURES / "torch-2.13")
    text = (FIXTURES / "torch-2.13" / "_dynamo" / "eval_frame.py").read_text().splitlines()
    assert text[layout.guard.line - 1].strip() == "raise RuntimeError("
    assert text[layout.guard.if_line - 1].strip() == "if ("
    numbers = [number for number, _ in layout.guard.source]
    assert numbers == list(range(layout.guard.if_line, numbers[-1] + 1)) and layout.guard.line in numbers
    assert [text for _, text in layout.guard.source] == text[numbers[0] - 1:numbers[-1]]


def test_module_global_flag_details():
    flag = read_layout(FIXTURES / "torch-2.6").fx_flag
    source = (FIXTURES / "torch-2.6" / "fx" / "_symbolic_trace.py").read_text().splitlines()
    assert source[flag.line - 1] == "_is_fx_tracing_flag = False"
    assert (flag.writer, source[flag.writer_line - 1].strip()) == ("Tracer.trace", "_is_fx_tracing_flag = True")
    assert flag.restores_saved_value is True and flag.attribute is None


def test_thread_local_flag_is_followed_through_a_helper():
    flag = read_layout(FIXTURES / "torch-2.14").fx_flag
    assert (flag.name, flag.attribute, flag.storage, flag.writer) == (
        "_is_fx_tracing_tls", "flag", "thread-local", "Tracer.trace")


def test_2_13_masking_site_is_the_compile_session_context_in_compile():
    layout = read_layout(FIXTURES / "torch-2.13")
    assert (layout.masking.function, layout.masking.context) == (
        "_compile.compile_inner", "torch.compiler._compile_session_context")
    assert layout.compiling_flag.name == "_is_compiling_flag"
    assert layout.compiling_flag.writer == "_compile_session_context"


def test_export_setting_the_compiling_flag_is_not_masking():
    # 2.11's export context sets torch.compiler._is_compiling_flag, but Dynamo's compile never enters it.
    layout = read_layout(FIXTURES / "torch-2.11")
    assert layout.masking is None and layout.compiling_flag.writer is None
    assert layout.compile_sets_compiling_flag is False
    assert any("nothing in" in note and "convert_frame.py" in note for note in layout.notes)


def test_the_compiling_flag_is_read_even_when_the_guard_ignores_it():
    # 2.4-2.8's predicate does not call is_compiling(), but other threads' code does: the flag is read anyway.
    layout = read_layout(FIXTURES / "torch-2.6")
    assert not layout.consults_is_compiling and layout.compiling_flag.name == "_is_compiling_flag"
    assert layout.compile_sets_compiling_flag is False and layout.masked_during_compile is False


def test_unknown_layout_says_what_was_found():
    layout = read_layout(FIXTURES / "torch-unknown")
    assert layout.fx_flag is None and not layout.known
    assert layout.unknown_reason == (
        "torch.fx._symbolic_trace.is_fx_symbolic_tracing reads no module state this tool recognises")


def _bundle(eval_frame: str, symbolic_trace: str, **more: str) -> str:
    files = {"_dynamo/eval_frame.py": eval_frame, "fx/_symbolic_trace.py": symbolic_trace, **more}
    return "".join(f"# ==> {path} <==\n{text}\n" for path, text in files.items())


_GLOBAL_FLAG = (
    "_flag = False\n"
    "def is_fx_tracing():\n"
    "    return _flag\n"
    "class Tracer:\n"
    "    def trace(self, root):\n"
    "        global _flag\n"
    "        _flag = True\n"
)
_RAISE = 'raise RuntimeError("Detected that you are using FX to symbolically trace a dynamo-optimized function.")'


@pytest.mark.parametrize("eval_frame, bound_at_wrap", [
    # the predicate called through its full dotted name (torch 2.0-era shape)
    ("import torch\ndef wrap(fn):\n    def _fn():\n        if torch.fx._symbolic_trace.is_fx_tracing():\n"
     f"            {_RAISE}\n    return _fn\n", False),
    # imported by name at module level
    ("from torch.fx._symbolic_trace import is_fx_tracing\ndef wrap(fn):\n    def compile_wrapper():\n"
     f"        if is_fx_tracing():\n            {_RAISE}\n    return compile_wrapper\n", False),
    # a relative import of the package, then an attribute chain
    ("from .. import fx\ndef wrap(fn):\n    def compile_wrapper():\n"
     f"        if fx._symbolic_trace.is_fx_tracing():\n            {_RAISE}\n    return compile_wrapper\n", False),
    # bound inside the wrapper itself: looked up on every call
    ("import torch\ndef wrap(fn):\n    def compile_wrapper():\n        check = torch.fx._symbolic_trace.is_fx_tracing\n"
     f"        if check():\n            {_RAISE}\n    return compile_wrapper\n", False),
])
def test_predicate_resolution_shapes(eval_frame, bound_at_wrap):
    layout = read_layout_text(_bundle(eval_frame, _GLOBAL_FLAG))
    assert layout.guard.predicate_qualname == "torch.fx._symbolic_trace.is_fx_tracing"
    assert layout.guard.bound_at_wrap is bound_at_wrap
    assert (layout.fx_flag.name, layout.fx_flag_storage, layout.fx_flag.writer) == ("_flag", "module-global",
                                                                                    "Tracer.trace")


def test_a_context_var_flag_counts_as_thread_local():
    symbolic_trace = (
        "import contextvars\n_tracing = contextvars.ContextVar('tracing', default=False)\n"
        "def is_fx_tracing():\n    return _tracing.get()\n"
    )
    eval_frame = f"import torch\ndef w():\n    if torch.fx._symbolic_trace.is_fx_tracing():\n        {_RAISE}\n"
    layout = read_layout_text(_bundle(eval_frame, symbolic_trace))
    assert (layout.fx_flag.name, layout.fx_flag.attribute, layout.fx_flag_storage) == (
        "_tracing", "get", "thread-local")


@pytest.mark.parametrize("eval_frame, note", [
    ("def compile_wrapper():\n    return 1\n", "no `raise RuntimeError"),
    ("def compile_wrapper(:\n", "torch/_dynamo/eval_frame.py does not parse"),
    (f"import torch\ndef compile_wrapper():\n    {_RAISE}\n", "is not inside an `if` that calls a predicate"),
    (f"def compile_wrapper():\n    if mystery():\n        {_RAISE}\n", "could not resolve what `mystery` refers to"),
])
def test_unrecognisable_guards_are_unknown_with_a_note(eval_frame, note):
    layout = read_layout_text(_bundle(eval_frame, _GLOBAL_FLAG))
    assert layout.fx_flag_storage == "unknown"
    assert note in layout.unknown_reason and layout.unknown_reason in layout.notes


def test_missing_eval_frame_is_unknown():
    layout = read_layout_text("# ==> fx/_symbolic_trace.py <==\n" + _GLOBAL_FLAG)
    assert layout.guard is None and layout.fx_flag_storage == "unknown"
    assert layout.notes == ("no readable torch/_dynamo/eval_frame.py",
                            "no readable definition of torch.compiler.is_compiling")
    assert layout.unknown_reason == layout.notes[0]


def test_a_module_level_alias_of_the_predicate_is_followed():
    eval_frame = ("import torch\n_tracing = torch.fx._symbolic_trace.is_fx_tracing\n"
                  f"def compile_wrapper():\n    if _tracing():\n        {_RAISE}\n")
    layout = read_layout_text(_bundle(eval_frame, _GLOBAL_FLAG))
    assert layout.guard.predicate_qualname == "torch._dynamo.eval_frame._tracing"
    assert (layout.fx_flag.name, layout.fx_flag_storage) == ("_flag", "module-global")
