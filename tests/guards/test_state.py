"""Versions, env, caches and the live state, read for real (files, an imported torch) where this machine can."""
from __future__ import annotations

from pathlib import Path

import pytest

from dflash_doctor.guards import run_guards
from dflash_doctor.guards.probes import PROBE_NAMES
from dflash_doctor.guards.state import (
    cache_facts, inductor_cache_dir, read_env, read_versions, triton_cache_dir,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "guards"


def test_cache_facts_count_files_and_bytes_below_the_folder(tmp_path):
    (tmp_path / "fxgraph" / "ab").mkdir(parents=True)
    (tmp_path / "fxgraph" / "ab" / "entry").write_bytes(b"x" * 100)
    (tmp_path / "locks").mkdir()
    (tmp_path / "top").write_bytes(b"y" * 20)
    (tmp_path / "link").symlink_to(tmp_path / "top")
    facts = cache_facts(tmp_path)
    assert facts.to_dict() == {"dir": str(tmp_path), "exists": True, "bytes": 120, "entries": 2, "truncated": False}
    assert cache_facts(tmp_path, max_files=1).truncated is True
    assert cache_facts(tmp_path / "absent").to_dict() == {
        "dir": str(tmp_path / "absent"), "exists": False, "bytes": 0, "entries": 0, "truncated": False}


def test_cache_dirs_follow_the_environment(tmp_path):
    assert inductor_cache_dir({"TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert inductor_cache_dir({}).name.startswith("torchinductor_")
    assert triton_cache_dir({"TRITON_CACHE_DIR": str(tmp_path / "t")}) == tmp_path / "t"
    assert triton_cache_dir({"TRITON_HOME": str(tmp_path)}) == tmp_path / ".triton" / "cache"


def test_versions_from_metadata_and_version_py():
    known = {"triton": None, "pytorch-triton": "3.6.0", "transformers": "5.6.0"}
    versions = read_versions("2.11.0+cu130", "13.0", None, version_of=known.get)
    assert {k: versions[k] for k in ("torch", "torch_build", "cuda", "hip", "triton", "transformers")} == {
        "torch": "2.11.0+cu130", "torch_build": "CUDA 13.0", "cuda": "13.0", "hip": None, "triton": "3.6.0",
        "transformers": "5.6.0"}
    assert read_versions(None, None, "6.2", version_of={"torch": "2.9.0"}.get)["torch_build"] == "ROCm 6.2"


def test_env_reports_every_relevant_variable():
    env = read_env({"TORCH_LOGS": "+dynamo", "HOME": "/root"})
    assert env["TORCH_LOGS"] == "+dynamo" and env["TORCHINDUCTOR_CACHE_DIR"] is None and "HOME" not in env


def _static(folder, tmp_path, **kwargs):
    environ = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    return run_guards(probes=False, torch_root=FIXTURES / folder, environ=environ, modules={}, **kwargs)


def test_static_report_for_a_stand_in_layout(tmp_path):
    report = _static("torch-2.13", tmp_path)
    facts = report.facts
    assert [f.code for f in report.sorted_findings()] == ["DFD609", "DFD605", "DFD601", "DFD611"]
    assert facts["verdict"] == "vulnerable" and report.problems == []
    assert facts["probes"] == dict.fromkeys(PROBE_NAMES, "skipped")
    assert facts["config"] == {"error_on_nested_fx_trace": None, "force_compile_during_fx_trace": None}
    assert facts["fx_flag_now"] is None and facts["state_source"].startswith("not read")
    # a source tree says nothing about this host's caches, however cold they are
    assert facts["compile_cache"] is None and facts["env"] is None
    assert facts["corroboration"]["agrees"] is True


def test_unknown_layout_is_a_problem_per_hazard_and_verdict_unknown(tmp_path):
    report = _static("torch-unknown", tmp_path)
    assert report.facts["verdict"] == "unknown" and report.facts["fx_flag_storage"] == "unknown"
    reason = ("the source does not say where the FX-tracing flag lives: torch.fx._symbolic_trace."
              "is_fx_symbolic_tracing reads no module state this tool recognises")
    assert [(p.subject, p.reason) for p in report.problems[:2]] == [
        ("hazard fx-flag-leak", f"could not tell whether the FX-flag leak across threads is possible here: {reason}"),
        ("hazard stuck-flag", f"could not tell whether the stuck FX flag is possible here: {reason}")]
    assert [p.subject for p in report.problems[2:]] == ["hazard is-compiling-leak", "hazard deadlock",
                                                        "hazard fx-patcher-race"]
    # worst first: the deadlock, the stuck flag, the leak, the is-compiling leak
    assert report.facts["verdict_reasons"][1:3] == [f"stuck FX flag: unknown: {reason}",
                                                    f"FX-flag leak across threads: unknown: {reason}"]
    # every hazard may be there: the concurrent pair stops every severe one (the is-compiling leak is minor)
    assert [fix["mitigation"] for fix in report.facts["fixes"]] == [
        "threadlocal-flag,non-lazy-backward", "threadlocal-flag,single-thread-autograd", "warmup", "global-lock",
        "processes"]


@pytest.mark.timeout(120)
def test_live_state_of_this_process_when_dynamo_is_loaded(tmp_path):
    torch = pytest.importorskip("torch")
    import torch._dynamo
    import torch.fx._symbolic_trace as symbolic_trace

    environ = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    (tmp_path / "graph").write_bytes(b"cached")
    clean = run_guards(probes=False, environ=environ)
    assert clean.facts["state_source"] == "this process"
    assert clean.facts["config"] == {"error_on_nested_fx_trace": True, "force_compile_during_fx_trace": False}
    assert clean.facts["fx_flag_now"] is False
    assert [f.code for f in clean.sorted_findings()] == ["DFD609", "DFD605", "DFD601", "DFD611"]

    saved = symbolic_trace._is_fx_tracing_flag
    symbolic_trace._is_fx_tracing_flag = True  # what an out-of-order trace exit leaves behind
    try:
        with torch._dynamo.config.patch(error_on_nested_fx_trace=False):
            corrupted = run_guards(probes=False, environ=environ)
    finally:
        symbolic_trace._is_fx_tracing_flag = saved
    assert corrupted.facts["fx_flag_now"] is True
    assert {f.code for f in corrupted.findings} == {"DFD601", "DFD602", "DFD603", "DFD605", "DFD609", "DFD611"}
    assert corrupted.facts["hazards"]["stuck-flag"]["reason"].startswith("the FX-tracing flag is True right now")
    assert [fix["fix"].split(":")[0] for fix in corrupted.facts["fixes"][:2]] == [
        "Restart the process", "Set torch._dynamo.config.error_on_nested_fx_trace = True and "
        "force_compile_during_fx_trace = False (the defaults) by removing the assignments that changed them, in every "
        "thread that made one (from torch 2.12 each thread keeps its own value"]


def test_a_crashed_probe_host_leaves_the_static_verdict_and_one_problem_per_probe(tmp_path):
    from dflash_doctor.guards.runner import ChildResult
    from dflash_doctor.guards.torch_sources import installed_torch_root

    if installed_torch_root() is None:
        pytest.skip("reads the installed torch's layout")

    def crashed(argv, timeout):
        return ChildResult(-9, "", "Killed\n", 0.4)

    report = run_guards(probes=True, timeout=5, runner=crashed, fork=True, modules={},
                        environ={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path)})
    assert report.facts["verdict"] == "vulnerable"  # the installed 2.13's module-global flag, read statically
    assert report.facts["probes"] == dict.fromkeys(PROBE_NAMES, "error")
    assert report.facts["state_source"] == "not read: the probe host reported nothing (see problems)"
    assert [(p.subject, p.reason) for p in report.problems] == [
        (f"probe {name}", "the probe process was killed by signal 9: Killed")
        for name in PROBE_NAMES]
    assert report.exit_code() == 5
