"""The compile-lock question on each layout family: does the backward compile take Dynamo's compile_lock, does
AOTAutograd compile the backward lazily, is there a switch to compile it with the forward?"""
from __future__ import annotations

from pathlib import Path

import pytest

from dflash_doctor.guards import read_layout, read_layout_text
from dflash_doctor.guards.verdict import ABSENT, PRESENT, UNKNOWN, decide_hazards
from dflash_doctor.hazards import Hazard

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "guards"
OLD_LAZY = "AOTDispatchAutograd.post_compile.CompiledFunction.backward"
NEW_LAZY = "_AutogradBackwardCompiler.get_or_compile"


def _line(site) -> str:
    return Path(site.file).read_text().splitlines()[site.line - 1]


@pytest.mark.parametrize("folder, takes_lock, path, lazy_function, non_lazy", [
    # 2.4-2.5: the nested backward compiler takes no lock
    ("torch-2.4", False, ("compile_fx.bw_compiler",), OLD_LAZY, False),
    # 2.6-2.8: the nested backward compiler takes it itself
    ("torch-2.6", True, ("compile_fx.bw_compiler",), OLD_LAZY, False),
    # 2.9-2.15: through the module-level compile_fx_backward; the switch from 2.10; a new lazy site from 2.12
    ("torch-2.11", True, ("_compile_fx_main.bw_compiler", "compile_fx_backward"), OLD_LAZY, True),
    ("torch-2.13", True, ("_compile_fx_main.bw_compiler", "compile_fx_backward"), NEW_LAZY, True),
    ("torch-2.14", True, ("_compile_fx_main.bw_compiler", "compile_fx_backward"), NEW_LAZY, True),
])
def test_each_family_answers_the_compile_lock_question(folder, takes_lock, path, lazy_function, non_lazy):
    backward = read_layout(FIXTURES / folder).backward
    assert (backward.takes_lock, backward.path, backward.lazy_backward, backward.non_lazy_available) == (
        takes_lock, path, True, non_lazy)
    assert backward.compiler.function == path[0]
    assert _line(backward.compiler).lstrip().startswith("def bw_compiler(")
    if takes_lock:
        assert backward.lock.function == path[-1] and "compile_lock" in _line(backward.lock)
        assert _line(backward.lock).lstrip().startswith("with ")
    else:
        assert backward.lock is None
    assert backward.lazy.function == lazy_function and "compiled_bw = " in _line(backward.lazy)
    assert "with compile_lock:" in _line(backward.holder)
    assert (_line(backward.non_lazy_option).startswith("force_non_lazy_backward_lowering = ")
            if non_lazy else backward.non_lazy_option is None)


@pytest.mark.parametrize("folder, state", [("torch-2.4", ABSENT), ("torch-2.6", PRESENT), ("torch-2.11", PRESENT),
                                           ("torch-2.13", PRESENT), ("torch-2.14", PRESENT),
                                           ("torch-unknown", UNKNOWN)])
def test_the_deadlock_verdict_per_family_cites_its_lines(folder, state):
    layout = read_layout(FIXTURES / folder)
    [deadlock] = [v for v in decide_hazards(layout, {}, None) if v.hazard is Hazard.DEADLOCK]
    assert deadlock.state == state
    for citation in deadlock.cited:
        assert citation.what in Path(citation.file).read_text().splitlines()[citation.line - 1]
    expected = {ABSENT: ["bw_compiler"], PRESENT: ["compile_lock", "compiled_bw", "compile_lock"], UNKNOWN: []}
    assert [c.what for c in deadlock.cited] == expected[state]


def test_no_inductor_source_leaves_the_question_unknown_and_says_why():
    backward = read_layout(FIXTURES / "torch-unknown").backward
    assert (backward.takes_lock, backward.lazy_backward, backward.non_lazy_available) == (None, None, None)
    assert backward.notes[0] == f"no readable {FIXTURES / 'torch-unknown' / '_inductor/compile_fx.py'}: the backward " \
                                "compiler was not read"


_HOLDER = ("# ==> _dynamo/convert_frame.py <==\nimport threading\ncompile_lock = threading.RLock()\n"
           "def compile_frame(frame):\n    with compile_lock:\n        return frame\n")
_LAZY = ("# ==> _functorch/_aot_autograd/runtime_wrappers.py <==\nclass Backward:\n    def run(self, module):\n"
         "        if self.compiled_bw is None:\n            self.compiled_bw = self.bw_compiler(module, [])\n")


def _backward(compile_fx: str, lazy: str = _LAZY):
    return read_layout_text(_HOLDER + "# ==> _inductor/compile_fx.py <==\n" + compile_fx + lazy).backward


def test_a_lock_named_compile_lock_that_is_not_dynamos_is_not_counted():
    backward = _backward("import threading\ncompile_lock = threading.Lock()\n"
                         "def compile_fx(aot):\n    def bw_compiler(gm, inputs):\n        with compile_lock:\n"
                         "            return gm\n    return aot(bw_compiler=bw_compiler)\n")
    assert backward.takes_lock is False and backward.lock is None


def test_a_module_import_of_convert_frame_is_resolved_through_two_helpers():
    backward = _backward("import torch._dynamo.convert_frame as cf\n"
                         "def _locked(gm):\n    with cf.compile_lock:\n        return gm\n"
                         "def _backward(gm):\n    return _locked(gm)\n"
                         "def compile_fx(aot):\n    def bw_compiler(gm, inputs):\n        return _backward(gm)\n"
                         "    return aot(bw_compiler=bw_compiler)\n")
    assert backward.takes_lock is True
    assert backward.path == ("compile_fx.bw_compiler", "_backward", "_locked") and backward.lock.line == 3


def test_no_backward_compiler_handed_over_is_unknown_not_absent():
    backward = _backward("def compile_fx(aot):\n    return aot(fw_compiler=None)\n")
    assert backward.takes_lock is None and backward.compiler is None
    layout_states = _states(_HOLDER + "# ==> _inductor/compile_fx.py <==\ndef compile_fx(aot):\n    return aot()\n"
                            + _LAZY)
    assert layout_states[Hazard.DEADLOCK] == UNKNOWN


def test_an_unrecognised_lazy_backward_is_unknown_not_absent():
    locked = ("def compile_fx(aot):\n    def bw_compiler(gm, inputs):\n"
              "        from torch._dynamo.convert_frame import compile_lock\n        with compile_lock:\n"
              "            return gm\n    return aot(bw_compiler=bw_compiler)\n")
    refactored = "# ==> _functorch/_aot_autograd/runtime_wrappers.py <==\ndef backward(ctx):\n    return ctx\n"
    backward = _backward(locked, refactored)
    assert (backward.takes_lock, backward.lazy_backward) == (True, None)
    assert _states(_HOLDER + "# ==> _inductor/compile_fx.py <==\n" + locked + refactored)[Hazard.DEADLOCK] == UNKNOWN
    assert _states(_HOLDER + "# ==> _inductor/compile_fx.py <==\n" + locked + _LAZY)[Hazard.DEADLOCK] == PRESENT


def _states(bundle: str) -> dict:
    return {v.hazard: v.state for v in decide_hazards(read_layout_text(bundle), {}, None)}
