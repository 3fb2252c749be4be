"""`repro --mode dataparallel` on a CPU: the stand-in runs torch's own DataParallel.forward in one thread per
replica, replicas share the original's parameters as torch's replicate makes them, and a compiled module under
DataParallel breaks the user's model (real torch, real compiles, real threads, children as the CLI starts them)."""
from __future__ import annotations

import threading

import pytest

from dflash_doctor.dataparallel import FIXES
from dflash_doctor.errors import UsageError
from dflash_doctor.outcomes import FailureKind, ThreadOutcome
from dflash_doctor.repro import dataparallel as dp
from tests.conftest import run_cli_json


def test_a_form_result_travels_through_its_codec_and_a_renamed_field_fails_loudly():
    result = dp.FormResult("compiled-inside", "cpu", 3, outcome="error", steps=0, model_intact=False)
    assert dp.FormResult.from_dict(result.to_dict()) == result
    renamed = result.to_dict()
    renamed["intact"] = renamed.pop("model_intact")
    with pytest.raises(ValueError, match="unknown"):
        dp.FormResult.from_dict(renamed)
    for field in ("outcome", "graphs", "model_intact"):  # a field with a default is no less required
        missing = result.to_dict()
        del missing[field]
        with pytest.raises(ValueError, match=f"missing \\['{field}'\\]"):
            dp.FormResult.from_dict(missing)


def test_a_form_spec_travels_through_its_codec_and_another_version_fails_loudly():
    spec = dp.FormSpec("compiled-inside", "cpu", 3, 2, 16)
    assert dp.FormSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError, match="version"):
        dp.FormSpec.from_dict({**spec.to_dict(), "version": 2})
    dropped = spec.to_dict()
    del dropped["width"]
    with pytest.raises(ValueError, match=r"missing \['width'\]"):
        dp.FormSpec.from_dict(dropped)


def test_every_fix_is_complete_and_the_rule_advises_from_the_table():
    from dflash_doctor import mitigations
    from dflash_doctor.rules.repro import DATAPARALLEL_COMPILED_MODULE

    forms = [fix.form for fix in FIXES]
    assert dp.BASELINE not in forms and len(set(forms)) == len(forms)
    for fix in FIXES:
        assert fix.api and fix.caveat and fix.measured, fix.name
        assert fix.registry_entry is None or fix.registry_entry in mitigations.BY_NAME
        assert fix.name in DATAPARALLEL_COMPILED_MODULE.fix and fix.api in DATAPARALLEL_COMPILED_MODULE.fix


def test_mitigation_names_are_the_dataparallel_fixes_only():
    assert dp.parse_fixes("none") == ()
    assert dp.parse_fixes("compile-outside-dataparallel,processes") == ("compile-outside-dataparallel", "processes")
    with pytest.raises(UsageError, match="compile-outside-dataparallel"):
        dp.parse_fixes("threadlocal-flag")
    spec = dp.DataParallelSpec(fixes=("processes",))
    assert spec.forms() == (dp.DataParallelForm.COMPILED_INSIDE, dp.DataParallelForm.PROCESSES)


def test_a_broken_model_is_the_wrapper_corruption_and_the_fx_error_is_the_flag_leak():
    broken = dp.FormResult("compiled-inside", "cpu", 3, outcome="error", model_intact=False,
                           error="AttributeError: Caught AttributeError in replica 0 on device cpu.")
    leak = dp.FormResult("per-replica", "cpu", 3, outcome="error", model_intact=True,
                         error="RuntimeError: Caught RuntimeError in replica 1 on device 0.",
                         traceback="RuntimeError: Detected that you are using FX to symbolically trace a "
                                   "dynamo-optimized function. This is not supported at the moment.")
    fine = dp.FormResult("compiled-outside", "cpu", 3, outcome="ok", steps=3, model_intact=True)
    assert dp.classify(broken) is FailureKind.DATAPARALLEL_COMPILED_MODULE
    assert dp.classify(leak) is FailureKind.FX_FLAG_LEAK
    assert dp.classify(fine) is None


@pytest.mark.timeout(120)
def test_the_stand_in_runs_torchs_forward_one_thread_per_replica_with_shared_parameters():
    torch = pytest.importorskip("torch")
    from dflash_doctor.repro.dataparallel_cpu import ReplicaThreads

    class Recorder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.threads = set()

        def forward(self, x):
            self.threads.add(threading.current_thread().name)  # names are unique, idents are reused
            return self.linear(x)

    model = Recorder()
    wrapper = ReplicaThreads(model, 3)
    assert type(wrapper).forward is torch.nn.DataParallel.forward  # torch's own, as Dynamo meets it on a GPU
    wrapper(torch.randn(6, 4)).sum().backward()
    assert len(model.threads) == 3 and threading.current_thread().name not in model.threads  # one shared set
    assert model.linear.weight.grad is not None and model.linear.weight.grad.abs().sum() > 0  # grads reach the leaf


@pytest.mark.timeout(180)
def test_compiling_outside_the_wrapper_leaves_the_replica_threads_uncompiled():
    # Dynamo's frame hook is per thread: the replica threads start without it, so nothing in them is compiled.
    torch = pytest.importorskip("torch")
    from dflash_doctor.repro.dataparallel_cpu import ReplicaThreads

    compiled_in = []

    def backend(graph_module, example_inputs):
        compiled_in.append(threading.current_thread().name)
        return graph_module.forward

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    torch.compile(ReplicaThreads(model, 3), backend=backend)(torch.randn(6, 8)).sum().backward()
    assert compiled_in == []
    torch.compile(model, backend=backend)(torch.randn(6, 8))  # the same backend compiles the model itself
    assert compiled_in == ["MainThread"]


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(300)
def test_the_mode_reproduces_the_corruption_and_checks_the_fix_through_the_cli(tmp_path):
    proc, doc = run_cli_json("repro", "--mode", "dataparallel", "--threads", "3", "--device", "cpu", "--steps", "2",
                             "--mitigation", "compile-outside-dataparallel", "--timeout", "240", timeout=290)
    assert proc.returncode == 1, proc.stderr[-2000:]
    facts = doc["facts"]
    forms = {form["form"]: form for form in facts["forms"]}
    assert list(forms) == ["compiled-inside", "compiled-outside"]
    inside, outside = forms["compiled-inside"], forms["compiled-outside"]
    assert facts["verdict"] == "reproduced" and facts["kind"] == "dataparallel-compiled-module"
    assert inside["outcome"] == ThreadOutcome.ERROR and inside["steps"] == 0 and inside["model_intact"] is False
    assert "in replica 0 on device cpu" in inside["error"]
    assert outside["outcome"] == ThreadOutcome.OK and outside["steps"] == 2 and outside["model_intact"] is True
    assert outside["fix_outcome"] == ("holds" if outside["graphs"] else "ran-uncompiled")
    assert [f["code"] for f in doc["findings"]] == ["DFD707"]
    # the JSON keys are the typed model's (repro/dataparallel_facts.py)
    from dflash_doctor.repro.dataparallel_facts import DataParallelFacts, FormFacts

    for model, document in [(DataParallelFacts, facts)] + [(FormFacts, form) for form in facts["forms"]]:
        assert model.__required_keys__ <= set(document) <= model.__required_keys__ | model.__optional_keys__
    # the text view draws the same facts: every form's code, the broken model, the verdict
    from rich.console import Console

    from dflash_doctor.render.dataparallel_view import render_dataparallel_facts

    console = Console(width=100, record=True)
    render_dataparallel_facts(console, facts)
    text = console.export_text()
    assert inside["code"] in text and outside["code"] in text
    assert "its submodules are gone" in text and "reproduced (dataparallel-compiled-module)" in text


@pytest.mark.slow  # a cold compile per fix, one of them in three processes: `pytest -m slow`
@pytest.mark.timeout(400)
@pytest.mark.parametrize("fix", FIXES, ids=lambda fix: fix.name)
def test_every_dataparallel_fix_runs_its_steps_and_leaves_the_model_whole(fix, tmp_path):
    # What the table claims of each fix (its form runs and breaks nothing), proved on this machine.
    pytest.importorskip("torch")
    result = dp.run_form_child(dp.FormSpec(fix.form.value, "cpu", 3, 2, 32), tmp_path, 380)
    assert (result.outcome, result.steps, result.model_intact) == (ThreadOutcome.OK, 2, True), result.error
    assert dp.classify(result) is None
