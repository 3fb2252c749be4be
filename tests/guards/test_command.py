"""`dflash-doctor guards` as a user runs it: the real installed torch 2.13 once, stand-ins, missing torch."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_doctor import mitigations as registry
from dflash_doctor.guards.probes import PROBE_NAMES as PROBES
from dflash_doctor.guards.torch_sources import installed_torch_root
from tests.conftest import REPO, run_cli, run_cli_json

FIXTURES = REPO / "fixtures" / "guards"
HAZARDS = ("fx-flag-leak", "stuck-flag", "is-compiling-leak", "deadlock", "fx-patcher-race")


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory):
    folder = tmp_path_factory.mktemp("caches")
    return {"TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"), "TRITON_CACHE_DIR": str(folder / "triton")}


@pytest.fixture(scope="module")
def real_run(cache_env):
    """One real `guards --format json` on this machine's torch (probes included), shared by the tests below."""
    if installed_torch_root() is None:
        pytest.skip("torch is not installed here")
    return run_cli_json("guards", "--timeout", "60", env=cache_env, timeout=150)


def _raise_line(eval_frame: Path) -> int:
    """The guard's raise, found by plain text (independently of the AST analysis under test)."""
    lines = eval_frame.read_text().splitlines()
    message = next(i for i, line in enumerate(lines) if "Detected that you are using FX to symbolically trace" in line)
    return next(i for i in range(message, 0, -1) if lines[i].strip() == "raise RuntimeError(") + 1


@pytest.mark.timeout(200)
def test_real_torch_2_13_is_vulnerable_with_both_races_reproduced(real_run, cache_env):
    proc, doc = real_run
    facts = doc["facts"]
    assert facts["torch_version"].startswith("2.13.0")
    assert facts["fx_flag_storage"] == "module-global"
    root = installed_torch_root()
    assert facts["guard"]["file"] == str(root / "_dynamo" / "eval_frame.py")
    assert facts["guard"]["line"] == _raise_line(root / "_dynamo" / "eval_frame.py")
    assert facts["guard"]["predicate"] == "is_fx_symbolic_tracing"
    assert facts["masked_during_compile"] is True
    assert facts["config"] == {"error_on_nested_fx_trace": True, "force_compile_during_fx_trace": False}
    assert facts["fx_flag_now"] is False
    assert facts["probes"] == dict.fromkeys(PROBES, "reproduced")
    assert facts["compile_cache"] == {"dir": cache_env["TORCHINDUCTOR_CACHE_DIR"], "exists": False, "bytes": 0,
                                      "entries": 0, "truncated": False}
    assert facts["verdict"] == "vulnerable" and facts["worst_hazard"] == "deadlock"
    assert {name: h["state"] for name, h in facts["hazards"].items()} == dict.fromkeys(HAZARDS, "present")
    # each probe bore on its own hazard; the deadlock has no probe (it needs a GPU's autograd thread)
    assert {name: h["probe"] for name, h in facts["hazards"].items()} == {
        "fx-flag-leak": "reproduced", "stuck-flag": "reproduced", "is-compiling-leak": "reproduced", "deadlock": None,
        "fx-patcher-race": "reproduced"}
    patcher = facts["hazards"]["fx-patcher-race"]
    assert patcher["condition"] and [c["what"] for c in patcher["cited"]] == [
        "__getattr__", "__call__", "CURRENT_PATCHER", "NameError", "NameError"]
    assert facts["fx_patches"]["isolated"] is False and facts["fx_patches"]["patcher_storage"] == "module-global"
    assert facts["corroboration"]["agrees"] is True and facts["corroboration"]["read_from"] == "2.13.0"
    assert facts["release"] == {"version": facts["torch_version"], "fx_flag_thread_local": False,
                                "non_lazy_backward_available": True, "backward_compile_takes_compile_lock": True,
                                "fx_patches_isolated": False, "compile_settings_per_thread": True}
    # guards says where an assigned compile setting lives, read from utils/_config_module.py (a ContextVar on 2.13)
    settings = facts["compile_settings"]
    assert settings["storage"] == "per-thread" and settings["file"] == str(root / "utils" / "_config_module.py")
    assert "user_override.set(" in (root / "utils" / "_config_module.py").read_text().splitlines()[
        settings["write_line"] - 1]
    assert any(c.startswith("non-lazy-backward:") for c in settings["consequences"])
    # The conditional patcher race is not in the ranking (no fix grows isolate-fx-patches), but every fix that
    # leaves it open says so; each ranking says it was inferred (measured on 2.11, not on 2.13).
    assert [f.get("mitigation") or f["kind"] for f in facts["fixes"]] == [
        "threadlocal-flag,non-lazy-backward", "threadlocal-flag,single-thread-autograd", "warmup", "global-lock",
        "processes", "upgrade"]
    for fix in facts["fixes"]:
        if fix["kind"] == "mitigation":
            assert fix["evidence_label"] == "inferred" and fix["evidence"] == "inferred"
            named = any("FX patcher race" in caveat for caveat in fix["caveats"])
            assert named is ("fx-patcher-race" not in registry.covers(registry.parse(fix["mitigation"]))), fix
    assert sorted(f["code"] for f in doc["findings"]) == ["DFD601", "DFD604", "DFD605", "DFD606", "DFD607",
                                                          "DFD608", "DFD609", "DFD610", "DFD611"]
    assert doc["problems"] == [] and proc.returncode == doc["exit_code"] == 1
    for name in PROBES:
        assert 0 <= facts["probe_details"][name]["seconds"] < 60


def test_real_run_cites_lines_that_hold_what_they_name(real_run):
    for hazard in real_run[1]["facts"]["hazards"].values():
        assert hazard["cited"]
        for citation in hazard["cited"]:
            assert citation["what"] in Path(citation["file"]).read_text().splitlines()[citation["line"] - 1]


def test_real_run_contract_keys_come_first(real_run):
    _, doc = real_run
    assert list(doc["facts"])[:10] == ["torch_version", "fx_flag_storage", "guard", "masked_during_compile", "config",
                                       "fx_flag_now", "probes", "compile_cache", "verdict", "verdict_reasons"]


def _highlighted(rows) -> list:
    from dflash_doctor.render.guards_view import HIGHLIGHT

    return [row.plain[span.start:span.end] for row in rows for span in row.spans if span.style == HIGHLIGHT]


def test_text_view_highlights_the_predicate_and_the_flag(real_run):
    from dflash_doctor.render.guards_view import source_rows

    facts = real_run[1]["facts"]
    guard_rows = source_rows(facts["guard"]["source"], facts["guard"]["predicate"])
    flag_rows = source_rows(facts["fx_flag"]["source"], facts["fx_flag"]["name"])
    assert _highlighted(guard_rows) == ["is_fx_symbolic_tracing"]
    assert _highlighted(flag_rows) == ["_is_fx_tracing_flag", "_is_fx_tracing_flag"]
    # numbered like the file, dedented, with a gap marker between the flag's definition and its reader
    assert guard_rows[0].plain.split("│")[0].strip() == str(facts["guard"]["if_line"])
    assert [row.plain.split("│")[0].strip() for row in flag_rows] == [
        str(facts["fx_flag"]["line"]), "┆", str(facts["fx_flag"]["source"][1][0]),
        str(facts["fx_flag"]["source"][2][0])]


@pytest.mark.parametrize("folder", ["torch-2.4", "torch-2.14", "torch-unknown"])
def test_text_view_draws_partial_facts(folder, tmp_path):
    """Stand-ins leave state, probes and (unknown) the flag empty: the view must still draw them."""
    from rich.console import Console

    from dflash_doctor.guards import run_guards
    from dflash_doctor.render.guards_view import guards_view

    report = run_guards(probes=False, torch_root=FIXTURES / folder, environ={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path)},
                        modules={})
    with open(tmp_path / "out.txt", "w") as out:
        guards_view(Console(file=out, width=100), report.facts)
    assert (tmp_path / "out.txt").stat().st_size > 0


@pytest.mark.parametrize("folder, verdict, worst, codes, exit_code", [
    ("torch-2.4", "vulnerable", "stuck-flag", ["DFD601"], 1),
    ("torch-2.6", "vulnerable", "deadlock", ["DFD609", "DFD601"], 1),
    ("torch-2.11", "vulnerable", "deadlock", ["DFD609", "DFD601"], 1),
    ("torch-2.14", "vulnerable", "deadlock", ["DFD609", "DFD605", "DFD611"], 1),
    ("torch-unknown", "unknown", None, [], 4),
])
def test_stand_in_layouts_through_the_cli(folder, verdict, worst, codes, exit_code, cache_env):
    proc, doc = run_cli_json("guards", "--torch-root", FIXTURES / folder, env=cache_env)
    assert (doc["facts"]["verdict"], doc["facts"]["worst_hazard"]) == (verdict, worst)
    assert [f["code"] for f in doc["findings"]] == codes
    assert proc.returncode == exit_code
    assert doc["facts"]["probes"] == dict.fromkeys(PROBES, "skipped")


def test_torch_root_describes_the_tree_only(cache_env, tmp_path):
    """No cache, environment or host version reaches a --torch-root report, however the host is set up."""
    env = dict(cache_env, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1", TORCH_LOGS="+dynamo")
    _, doc = run_cli_json("guards", "--torch-root", FIXTURES / "torch-2.13", env=env)
    facts = doc["facts"]
    assert (facts["env"], facts["compile_cache"], facts["triton_cache"]) == (None, None, None)
    assert facts["versions"] == {"torch": "2.13.0+cpu", "torch_build": "CPU", "cuda": None, "hip": None}
    assert facts["state_source"] == "not read: --torch-root describes the source tree only"
    assert facts["config"] == {"error_on_nested_fx_trace": None, "force_compile_during_fx_trace": None}
    assert "DFD604" not in [f["code"] for f in doc["findings"]]


def test_a_release_outside_the_table_says_so_and_is_decided_from_source(cache_env):
    _, doc = run_cli_json("guards", "--torch-root", FIXTURES / "torch-unknown", env=cache_env)
    assert doc["facts"]["corroboration"] == {"release": "9.9", "consulted": False, "table_releases": "2.4-2.15",
                                             "table_row": None, "agrees": None, "differences": []}
    assert sorted(p["subject"] for p in doc["problems"]) == [f"hazard {h}" for h in sorted(HAZARDS)]


def test_a_planted_torch_py_in_the_working_folder_is_never_imported(tmp_path, cache_env):
    """`dflash-doctor guards` run from a folder holding torch.py: neither the CLI nor its probe children import it."""
    marker = tmp_path / "planted-ran"
    (tmp_path / "torch.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise SystemExit('planted torch')\n")
    proc, doc = run_cli_json("guards", "--timeout", "60", cwd=tmp_path, env=cache_env, timeout=150)
    assert not marker.exists()
    assert doc["facts"]["torch_root"] == str(installed_torch_root())
    assert doc["facts"]["probes"] == dict.fromkeys(PROBES, "reproduced") and doc["problems"] == []
    assert proc.returncode == 1


@pytest.mark.parametrize("value, message", [
    ("nan", "--timeout must be a finite number, got nan"),
    ("inf", "--timeout must be a finite number, got inf"),
])
def test_timeout_must_be_finite(value, message):
    proc = run_cli("guards", "--timeout", value)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"dflash-doctor: error: {message}\n")


def test_sarif_places_layout_findings_on_the_torch_source(cache_env):
    proc = run_cli("guards", "--torch-root", FIXTURES / "torch-2.13", "--format", "sarif", env=cache_env)
    results = json.loads(proc.stdout)["runs"][0]["results"]
    located = {r["ruleId"]: r["locations"][0]["physicalLocation"] for r in results if r["ruleId"] != "DFD604"}
    assert located["DFD601"]["artifactLocation"]["uri"] == "fixtures/guards/torch-2.13/fx/_symbolic_trace.py"
    assert located["DFD601"]["region"]["startLine"] == 4
    assert located["DFD605"]["artifactLocation"]["uri"] == "fixtures/guards/torch-2.13/compiler/__init__.py"
    assert proc.returncode == 1


def test_guards_reports_each_probe_i_of_k_on_stderr_and_nothing_with_quiet(real_run):
    # (the shared real run's stderr: a second real `guards` only for this took 5 s of the suite)
    proc, _ = real_run
    assert proc.returncode in (0, 1), proc.stderr
    lines = proc.stderr.splitlines()
    progress = [line for line in lines if line.startswith("guards [")]
    said = [line.split("] ", 1)[1] for line in progress]
    assert said[0].startswith("source: started")
    k = len(PROBES)
    for step, name in enumerate(PROBES, 1):
        assert f"probe {step}/{k} {name}: started" in said
        assert any(line.startswith(f"probe {step}/{k} {name}: ") and not line.endswith("started") for line in said)
    assert said[-1].startswith(f"probes: {k} of {k} ran: ")
    times = [float(line.split("[", 1)[1].split("s]", 1)[0]) for line in progress]
    assert times == sorted(times)
    assert lines[-1].startswith("guards: ")  # the summary still closes stderr

    quiet = run_cli("guards", "--no-probes", "-q", timeout=110)
    assert [line for line in quiet.stderr.splitlines() if line.startswith("guards [")] == []


def test_a_torch_root_without_dynamo_is_a_usage_error(tmp_path):
    proc = run_cli("guards", "--torch-root", tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"dflash-doctor: error: --torch-root {tmp_path}: no _dynamo/ folder there; pass the "
                           "torch package folder\n")


# A meta-path finder that makes `torch` unimportable for this one interpreter, as if it were not installed.
_HIDE_TORCH = """
import sys
class HideTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, HideTorch())
sys.argv = ["dflash-doctor", "guards"]
from dflash_doctor.cli import main
main()
"""


def test_missing_torch_is_one_line_and_exit_4():
    proc = subprocess.run([sys.executable, "-c", _HIDE_TORCH], capture_output=True, text=True, timeout=60,
                          cwd=REPO)
    assert proc.returncode == 4 and proc.stdout == ""
    assert re.fullmatch(r"dflash-doctor: error: dflash-doctor guards needs torch, which is not importable here "
                        r"\(ModuleNotFoundError: .*\); install it with: pip install torch .*\n", proc.stderr)
