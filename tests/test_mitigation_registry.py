"""The mitigation registry is the one place a fix is declared: every entry is complete and applies for real, and
everything that talks about fixes (docs/mitigations.md, the CLI help, the README, repro's matrix) derives from it."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from dflash_doctor import mitigations as registry
from dflash_doctor import runtime
from dflash_doctor.errors import UsageError
from dflash_doctor.hazards import Hazard, Release
from tests.conftest import REPO, run_cli

APPLY_HOOKS = ("setup", "wrap_step", "in_each_thread", "warm_up", "separate_processes")
# Markers that are torch's own names (scan finds them in user code that applies the fix without our runtime).
TORCH_MARKERS = ("force_non_lazy_backward_lowering", "set_multithreading_enabled")


@pytest.mark.parametrize("entry", registry.REGISTRY, ids=lambda e: e.name)
def test_every_entry_is_complete(entry):
    hooks = [hook for hook in APPLY_HOOKS if getattr(entry, hook)]
    assert len(hooks) == 1, f"{entry.name} must say how repro applies it: exactly one of {APPLY_HOOKS}"
    assert entry.summary and entry.api and entry.cost
    assert entry.covers or not entry.recommended, "a fix that stops nothing must be marked not recommended"
    if entry.pair_with:
        assert entry.pair_with in registry.BY_NAME and entry.pair_reason
    for marker in entry.source_markers:  # what scan looks for: a runtime call or a torch config name
        assert hasattr(runtime, marker) or marker in TORCH_MARKERS, marker
    for hazard in entry.leaves_open:  # every fix names the conditional hazards it leaves open, by name
        if hazard.conditional:
            assert any(hazard.label in caveat for caveat in registry.caveats_for((entry.name,))), hazard
    if entry.api.startswith("dflash_doctor.runtime.") or "= dflash_doctor.runtime." in entry.api:
        function = entry.api.split("dflash_doctor.runtime.")[1].split("(")[0]
        assert callable(getattr(runtime, function)), entry.api


def test_docs_and_help_are_generated_from_the_registry():
    from dflash_doctor.render.mitigations_doc import render

    assert (REPO / "docs" / "mitigations.md").read_text(encoding="utf-8") == render(), (
        "regenerate: python -m dflash_doctor.render.mitigations_doc --write")
    proc = run_cli("repro", "--help", timeout=60)
    # rich wraps long names at their hyphens ("single-" / "thread-autograd"): join those back
    help_text = " ".join(proc.stdout.split()).replace("- ", "-")
    assert all(name in help_text for name in registry.NAMES)


def test_the_readme_recommends_what_the_registry_ranks_first():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for release in (Release("2.11", False, True, True), Release("2.14.1", True, True, True)):
        best = registry.recommend(release.hazards(), release)[0]
        assert f"`{best.label}`" in readme, best.label


def test_combinations_parse_in_registry_order_and_solo_fixes_stay_alone():
    assert registry.parse("non-lazy-backward,threadlocal-flag") == ("threadlocal-flag", "non-lazy-backward")
    assert registry.parse("none") == ()
    for bad in ("bogus", ",", "none,warmup", "processes,warmup"):
        with pytest.raises(UsageError):
            registry.parse(bad)
    assert registry.MATRIX[0] == () and ("threadlocal-flag", "non-lazy-backward") in registry.MATRIX


def test_the_ladder_adds_forced_and_stuck_only_for_fixes_that_claim_flag_safety():
    assert [s.value for s in registry.ladder(("warmup",))] == ["natural", "amplified"]
    assert [s.value for s in registry.ladder(("threadlocal-flag", "non-lazy-backward"))] == [
        "natural", "amplified", "forced", "stuck"]


def test_a_pairing_is_met_by_the_pair_and_moot_where_the_partner_stops_nothing():
    def ranked(release):
        return {r.label: r for r in registry.recommend(release.hazards(), release)}

    on_211 = ranked(Release("2.11", False, True, True))
    assert not any("pair it with" in c for c in on_211["threadlocal-flag,non-lazy-backward"].caveats)
    on_29 = ranked(Release("2.9", False, False, True))  # no non-lazy switch: the shim alone leaves the deadlock
    assert on_29["threadlocal-flag"].gaps == frozenset({Hazard.DEADLOCK})
    on_25 = ranked(Release("2.5", False, False, False))  # no deadlock at all: the pairing is moot
    assert on_25["threadlocal-flag"].complete and not any("pair it" in c for c in on_25["threadlocal-flag"].caveats)


def test_a_bare_string_where_a_tuple_belongs_is_refused_at_declaration():
    with pytest.raises(TypeError, match="caveats must be a tuple"):
        registry.Mitigation(name="x", summary="s", api="a", covers=frozenset(), caveats="one", cost="c")


@pytest.mark.slow  # a fresh torch process per hook: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("entry", [e for e in registry.REGISTRY if e.setup], ids=lambda e: e.name)
def test_each_setup_hook_really_applies_in_a_fresh_process(entry):
    # A fresh interpreter: the hooks change torch's process-wide state, as they do in repro's children.
    pytest.importorskip("torch")
    script = textwrap.dedent(f"""
        import json, sys
        from dflash_doctor import mitigations as registry
        facts = registry.get({entry.name!r}).setup()
        import torch._functorch.config as functorch_config
        from dflash_doctor.runtime import verify_threadlocal_fx_flag
        print(json.dumps({{"facts": facts, "non_lazy": functorch_config.force_non_lazy_backward_lowering,
                           "shim_ok": verify_threadlocal_fx_flag()[0]}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=110,
                          cwd=str(REPO), env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    state = json.loads(proc.stdout.strip().splitlines()[-1])
    if entry.name == "threadlocal-flag":
        assert state["shim_ok"] and state["facts"]["shim"]["state"] == "installed"
    if entry.name == "non-lazy-backward":
        assert state["non_lazy"] is True and state["facts"] == {"non_lazy_backward_was": False}
    if entry.name == "isolate-fx-patches":
        assert state["facts"]["fx_patches"]["state"] == "installed" and state["facts"]["fx_patches_check"]["ok"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("entry", [e for e in registry.REGISTRY if e.wrap_step], ids=lambda e: e.name)
def test_each_step_wrapper_serialises_what_it_claims_with_real_threads(entry):
    # Generated from the registry: a wrapper must say what it serialises, and three real threads prove it.
    assert entry.serialises is not registry.Serialises.NOTHING or not entry.recommended, (
        f"{entry.name} wraps the step but claims to serialise nothing")
    guard, local = threading.Lock(), threading.local()
    inside = {"any": 0, "first": 0}
    peak = {"any": 0, "first": 0}
    calls = []

    def step():
        first = not getattr(local, "done", False)
        local.done = True
        with guard:
            for key in ("any", "first") if first else ("any",):
                inside[key] += 1
                peak[key] = max(peak[key], inside[key])
        threading.Event().wait(0.02)
        with guard:
            for key in ("any", "first") if first else ("any",):
                inside[key] -= 1
        calls.append(1)

    wrapped = [entry.wrap_step(step) for _ in range(3)]
    start = threading.Barrier(3)
    threads = [threading.Thread(target=lambda w=w: (start.wait(10), [w() for _ in range(3)])) for w in wrapped]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(calls) == 9, "the wrapper lost or repeated steps"
    if entry.serialises in (registry.Serialises.FIRST_STEPS, registry.Serialises.EVERY_STEP):
        assert peak["first"] == 1, f"{entry.name}: two threads' first steps overlapped"
    if entry.serialises is registry.Serialises.EVERY_STEP:
        assert peak["any"] == 1, f"{entry.name}: two threads' steps overlapped"


def test_ladders_and_the_matrix_follow_what_each_entry_claims():
    for entry in registry.REGISTRY:
        assert (Hazard.PATCHER_RACE in entry.covers) == ("foreign-trace" in {s.value for s in entry.ladder}), entry.name
        assert entry.leaves_open == frozenset(Hazard) - entry.covers
    for combination in registry.COMBINATIONS:
        assert all(name in registry.BY_NAME for name in combination.names)
        if len(combination.names) > 1:
            assert combination.names in registry.MATRIX, combination.names
    assert all((name,) in registry.MATRIX for name in registry.NAMES)


def test_naming_a_conditional_hazard_adds_its_narrowest_fix_to_every_combination_that_leaves_it_open():
    for release in (Release("2.8", False, False, True), Release("2.11", False, True, True),
                    Release("2.14.1", True, True, True)):
        plain = registry.recommend(release.hazards(), release)
        for hazard in (h for h in Hazard if h.conditional):
            told = registry.recommend(release.hazards(including=(hazard,)), release)
            assert all(r.complete for r in told if r.label in {p.label for p in plain if p.complete} or
                       any(r.label.startswith(p.label) for p in plain if p.complete))
            narrowest = min((m for m in registry.REGISTRY if hazard in m.covers and m.recommended and not m.solo),
                            key=lambda m: len(m.covers))
            for rec in told:
                assert hazard in rec.covers or hazard in rec.gaps
                if hazard not in registry.covers(tuple(n for n in rec.mitigations if n != narrowest.name)):
                    assert narrowest.name in rec.mitigations, rec.label
            # not told: no combination grows the conditional fix, and each leaving it open says so
            assert not any(narrowest.name in r.mitigations for r in plain)
            for rec in plain:
                if hazard not in registry.covers(rec.mitigations):
                    assert any(hazard.label in caveat for caveat in rec.caveats), rec.label


def test_evidence_is_measured_only_for_the_exact_parts_on_the_release_they_ran_on():
    on_211 = {r.label: r for r in registry.recommend(Release("2.11.0", False, True, True).hazards(),
                                                     Release("2.11.0", False, True, True))}
    assert on_211["threadlocal-flag,non-lazy-backward"].evidence == registry.MEASURED
    assert on_211["threadlocal-flag,non-lazy-backward"].to_dict()["evidence_label"] == "measured (2.11, H200)"
    on_214 = registry.recommend(Release("2.14.1", True, True, True).hazards(), Release("2.14.1", True, True, True))
    assert all(r.evidence == registry.INFERRED for r in on_214)  # the parts dropped there were never run alone


@pytest.mark.timeout(60)
@pytest.mark.parametrize("entry", [e for e in registry.REGISTRY if e.in_each_thread], ids=lambda e: e.name)
def test_each_per_thread_switch_is_entered_in_a_real_worker_thread_and_left_again(entry):
    # Generated from the registry: what the entry says it switches, read in the thread inside, outside and after.
    pytest.importorskip("torch")
    assert entry.switches, f"{entry.name} is entered in each thread but declares nothing it switches"
    seen, inside, leave = {}, threading.Event(), threading.Event()

    def values():
        return tuple(switch.read() for switch in entry.switches)

    before = values()

    def worker():
        with registry.in_each_thread((entry.name,))():
            seen["inside"] = values()
            inside.set()
            leave.wait(20)
        seen["after"] = values()

    thread = threading.Thread(target=worker)
    thread.start()
    assert inside.wait(20)
    seen["main"] = values()
    leave.set()
    thread.join(20)
    assert all(s.reach is registry.Reach.ENTERING_THREAD for s in entry.switches)
    assert seen == {"inside": tuple(s.value for s in entry.switches), "main": before, "after": before}


# A fresh interpreter per entry: the set-up changes process-wide state. It proves each switch of a set-up reaches
# the threads it claims on the installed torch: the calling thread, a thread started afterwards, a ThreadPoolExecutor
# worker; a thread started before the set-up reads the value inside the entry's per-thread form; and where the
# switch is a compile setting that compiles the backward with the forward, a worker's backward is compiled by its
# forward call, not lazily at backward() (an aot_autograd backend records when each compiler runs).
_SETUP_REACH = textwrap.dedent("""
    import json, sys, threading
    from concurrent.futures import ThreadPoolExecutor
    import torch
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from dflash_doctor import compile_settings, mitigations as registry, runtime

    entry = registry.get(sys.argv[1])
    events = []

    def compiler(kind):
        def compile_(gm, example_inputs):
            events.append((kind, threading.current_thread().name))
            return make_boxed_func(gm.forward)
        return compile_

    backend = aot_autograd(fw_compiler=compiler("fw"), bw_compiler=compiler("bw"))
    compiled = torch.compile(lambda x: (x.sin() * 2).sum(), backend=backend, dynamic=False)  # a compile per size
    go = threading.Event()

    def step(size):
        y = compiled(torch.randn(size, requires_grad=True))
        events.append(("forward-returned", threading.current_thread().name))
        y.backward()
        return [repr(s.read()) for s in entry.switches]

    def early():
        go.wait(30)
        with registry.in_each_thread((entry.name,))(), runtime.thread_config.in_this_thread(
                {s.setting: s.value for s in entry.switches
                 if compile_settings.setting(s.setting) is not None}):
            return step(5)

    # Every worker stays alive until all have compiled, as training workers do (torch 2.11's CPU build crashed,
    # in and out of this tool, compiling in a thread started after an earlier compiling thread had ended).
    finished, stop = threading.Event(), threading.Event()

    def later_worker():
        out["later"] = step(7)
        finished.set()
        stop.wait(60)

    before = threading.Thread(target=lambda: out.__setitem__("early", early()), name="early")
    out = {}
    before.start()
    entry.setup()
    out["main"] = [repr(s.read()) for s in entry.switches]
    later = threading.Thread(target=later_worker, name="later")
    later.start(); finished.wait(60)
    with ThreadPoolExecutor(1, thread_name_prefix="pool") as pool:
        out["pool"] = pool.submit(step, 9).result(60)
        go.set(); before.join(60)
    stop.set(); later.join(60)
    out["events"] = events
    print(json.dumps(out))
""")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("entry", [e for e in registry.REGISTRY if e.setup and e.switches], ids=lambda e: e.name)
def test_each_setup_switch_reaches_the_threads_it_claims(entry):
    pytest.importorskip("torch")
    if entry.unavailable(_installed_release()) is not None:
        pytest.skip(entry.unavailable(_installed_release()))
    import json
    import os

    proc = subprocess.run([sys.executable, "-c", _SETUP_REACH, entry.name], capture_output=True, text=True,
                          timeout=140, cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    wanted = [repr(s.value) for s in entry.switches]
    assert all(s.reach is registry.Reach.LATER_THREADS for s in entry.switches)
    assert out["main"] == wanted and out["later"] == wanted and out["pool"] == wanted, out
    assert out["early"] == wanted, "the per-thread form did not reach a thread started before the set-up"
    from dflash_doctor.compile_settings import SettingRole, setting

    if any((setting(s.setting) is not None and setting(s.setting).role is SettingRole.DEADLOCK_FIX)
           for s in entry.switches):
        for thread in ("later", "pool_0", "early"):
            mine = [kind for kind, name in out["events"] if name == thread]
            assert mine == ["fw", "bw", "forward-returned"], (thread, out["events"])


def _installed_release() -> Release:
    import torch._functorch.config as functorch_config

    return Release(non_lazy_backward_available=hasattr(functorch_config, "force_non_lazy_backward_lowering"))


def test_every_compile_setting_a_fix_switches_is_declared_where_its_reach_is_reasoned_about():
    from dflash_doctor.compile_settings import setting

    for entry in registry.REGISTRY:
        for switch in entry.switches:
            if switch.setting.startswith("torch._") and ".config." in switch.setting:
                assert setting(switch.setting) is not None, switch.setting
                assert entry.setup is not None or entry.in_each_thread is not None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("entry", [e for e in registry.REGISTRY if e.around_foreign_trace], ids=lambda e: e.name)
def test_what_a_tracing_thread_enters_keeps_every_wrapped_step_out_until_it_leaves(entry):
    inside, leave, stepped = threading.Event(), threading.Event(), []
    step = entry.wrap_step(lambda: stepped.append(inside.is_set() and not leave.is_set()))

    def tracer():
        with registry.around_foreign_trace((entry.name,))():
            inside.set()
            leave.wait(5)  # a worker's step tried meanwhile waits here

    thread = threading.Thread(target=tracer)
    thread.start()
    assert inside.wait(20)
    worker = threading.Thread(target=step)
    worker.start()
    worker.join(0.3)
    assert stepped == [] and worker.is_alive(), "a step ran inside the tracing thread's trace"
    leave.set()
    thread.join(20)
    worker.join(20)
    assert stepped == [False]
