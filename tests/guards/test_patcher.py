"""The FX patcher question read from source (guards/patcher.py): the class-wide patches and where the patcher
lives decide the conditional hazard, and a release whose patcher is per thread makes isolate-fx-patches moot."""
from __future__ import annotations

from pathlib import Path

from dflash_doctor import mitigations as registry
from dflash_doctor.guards.layout import read_layout, read_layout_text
from dflash_doctor.guards.verdict import ABSENT, PRESENT, UNKNOWN, decide_hazards, release_of
from dflash_doctor.hazards import Hazard

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "guards"

_TRACER = (
    "    def trace(self, root):\n"
    "        with _new_patcher() as patcher:\n"
    "            patcher.patch_method(torch.nn.Module, \"__getattr__\", self.getattr, deduplicate=False)\n"
    "            patcher.patch_method(torch.nn.Module, \"__call__\", self.call_module, deduplicate=False)\n"
    "            return root\n"
    "\n"
    "    def path_of_module(self, mod):\n"
    "        raise NameError(\"module is not installed as a submodule\")\n"
)
PER_THREAD = (
    "# ==> fx/_symbolic_trace.py <==\n"
    "import threading\n"
    "\n"
    "import torch\n"
    "\n"
    "_patcher_state = threading.local()\n"
    "\n"
    "\n"
    "class Tracer:\n" + _TRACER + "\n\n"
    "def _new_patcher():\n"
    "    prior = getattr(_patcher_state, \"current\", None)\n"
    "    _patcher_state.current = object()\n"
    "    try:\n"
    "        yield _patcher_state.current\n"
    "    finally:\n"
    "        _patcher_state.current = prior\n"
)
NO_PATCHES = "# ==> fx/_symbolic_trace.py <==\nclass Tracer:\n    def trace(self, root):\n        return root\n"


def _patcher_verdict(layout):
    return next(v for v in decide_hazards(layout, {}, None) if v.hazard is Hazard.PATCHER_RACE)


def test_every_release_family_stand_in_patches_the_class_with_a_module_global_patcher():
    for folder in ("torch-2.4", "torch-2.6", "torch-2.11", "torch-2.13", "torch-2.14"):
        layout = read_layout(FIXTURES / folder)
        patches = layout.fx_patches
        assert [s.what for s in patches.class_patches] == ["__getattr__", "__call__"]
        assert patches.patcher_storage == "module-global" and patches.isolated is False
        assert _patcher_verdict(layout).state == PRESENT
        assert release_of(layout).fx_patches_isolated is False


def test_a_per_thread_patcher_makes_the_race_absent_and_the_fix_moot():
    layout = read_layout_text(PER_THREAD)
    assert layout.fx_patches.patcher_storage == "thread-local" and layout.fx_patches.isolated is True
    verdict = _patcher_verdict(layout)
    assert verdict.state == ABSENT and "per thread" in verdict.reason
    release = release_of(layout)
    assert "already keeps torch.fx's patches" in (registry.get("isolate-fx-patches").unavailable(release) or "")
    assert Hazard.PATCHER_RACE not in release.hazards(including=(Hazard.PATCHER_RACE,))
    assert registry.open_conditions(("threadlocal-flag",), release) == ()


def test_a_tracer_that_patches_nothing_leaves_the_race_unknown_with_a_note():
    layout = read_layout_text(NO_PATCHES)
    verdict = _patcher_verdict(layout)
    assert verdict.state == UNKNOWN and "no patch_method" in verdict.reason
