"""Mitigation-aware DFD201: the README's fix makes it info; a partial fix keeps it an error and says what is open."""
from __future__ import annotations

import json
import textwrap

import pytest

from dflash_doctor.findings import Severity
from dflash_doctor.hazards import Hazard
from dflash_doctor.mitigations import BY_NAME
from dflash_doctor.scan import scan_paths, scan_source
from dflash_doctor.scan.fixes import DFD201_HAZARDS

THREADS = """\
    import threading
    import torch

    step = torch.compile(lambda x: x * 2)


    def worker(x):
        return step(x)


    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
"""
README_FIX = """\
    from dflash_doctor import runtime

    runtime.install_threadlocal_fx_flag()
    runtime.enable_non_lazy_backward()
"""


def dfd201(source: str):
    found = [f for f in scan_source(textwrap.dedent(source)) if f.code == "DFD201"]
    assert len(found) == 1
    return found[0]


def test_readme_fix_turns_dfd201_into_info_with_where_it_is_applied():
    finding = dfd201(README_FIX + THREADS)
    assert finding.severity is Severity.INFO
    assert finding.message.endswith(
        "; mitigated by threadlocal-flag (<string>:3), non-lazy-backward (<string>:4)")
    assert finding.evidence["mitigations"]["mitigated"] is True


@pytest.mark.parametrize("fix,applied", [
    ("from dflash_doctor import runtime\nruntime.install_threadlocal_fx_flag()\n", "threadlocal-flag"),
    ("from dflash_doctor import runtime\nruntime.enable_non_lazy_backward()\n", "non-lazy-backward"),
    ("from dflash_doctor.runtime import first_call_lock\nstep2 = first_call_lock(lambda: 0)\n", "first-call-lock"),
])
def test_a_partial_fix_stays_an_error_and_says_what_is_left_open(fix, applied):
    finding = dfd201(fix + textwrap.dedent(THREADS))
    assert finding.severity is Severity.ERROR
    assert f"applies {applied} (<string>:2), not enough: " in finding.message
    entry = BY_NAME[applied]
    assert (entry.pairing_caveat() or entry.caveats[0]) in finding.message
    open_hazards = [h for h in Hazard if h in DFD201_HAZARDS - entry.covers]
    assert f"leaves open: {', '.join(h.label for h in open_hazards)}" in finding.message
    assert finding.evidence["mitigations"]["mitigated"] is False


def test_first_call_lock_next_to_a_complete_fix_is_still_called_no_fix():
    fix = README_FIX + "    step3 = runtime.first_call_lock(lambda: 0)\n"
    finding = dfd201(fix + THREADS)
    assert finding.severity is Severity.ERROR
    assert "first-call-lock is not a fix" in finding.message


@pytest.mark.parametrize("fix", [
    "from dflash_doctor import runtime\n@runtime.global_lock\ndef locked(x):\n    return x\n",
    "import dflash_doctor.runtime as rt\nrt.warmup([lambda: 0])\n",
])
def test_complete_fixes_in_other_spellings(fix):
    assert dfd201(fix + textwrap.dedent(THREADS)).severity is Severity.INFO


MAIN_THREAD_SETTING = "a torch compile setting assigned outside this thread: from torch 2.12 each thread keeps its own"


@pytest.mark.parametrize("setting", [
    "import torch._functorch.config\ntorch._functorch.config.force_non_lazy_backward_lowering = True\n",
    "import torch\nwith torch._functorch.config.patch(force_non_lazy_backward_lowering=True):\n    pass\n",
    "import torch._functorch.config as fc\nsetattr(fc, 'force_non_lazy_backward_lowering', True)\n",
])
def test_torchs_own_switch_set_in_the_main_thread_does_not_reach_the_workers(setting):
    # torch >= 2.12 keeps compile settings in a ContextVar: a worker started later reads the default
    fix = "from dflash_doctor import runtime\nruntime.install_threadlocal_fx_flag()\n" + setting
    finding = dfd201(fix + textwrap.dedent(THREADS))
    assert finding.severity is Severity.ERROR
    assert f"non-lazy-backward (<string>:4): {MAIN_THREAD_SETTING}" in finding.message
    assert [a["mitigation"] for a in finding.evidence["mitigations"]["applied"]] == ["threadlocal-flag"]


def test_torchs_own_switch_set_inside_the_worker_counts():
    source = textwrap.dedent(THREADS).replace(
        "def worker(x):\n",
        "def worker(x):\n    torch._functorch.config.force_non_lazy_backward_lowering = True\n")
    finding = dfd201("from dflash_doctor import runtime\nruntime.install_threadlocal_fx_flag()\n" + source)
    assert finding.severity is Severity.INFO
    assert "non-lazy-backward (<string>:10)" in finding.message


@pytest.mark.parametrize("fix", [
    "def warmup(steps):\n    return steps\nwarmup(100)\n",  # an LR warm-up shares the name only
    "from mylib import global_lock\nglobal_lock()\n",
    "import torch._functorch.config as c\nc.force_non_lazy_backward_lowering = False\n",
    "# runtime.install_threadlocal_fx_flag(); runtime.enable_non_lazy_backward()\n",
])
def test_look_alike_markers_do_not_mitigate(fix):
    finding = dfd201(fix + textwrap.dedent(THREADS))
    assert finding.severity is Severity.ERROR and "applies" not in finding.message


def test_fixes_count_for_the_program_that_imports_the_threads(tmp_path):
    (tmp_path / "main.py").write_text(textwrap.dedent(README_FIX) + "import workers\n")
    (tmp_path / "workers.py").write_text(textwrap.dedent(THREADS))
    report = scan_paths([str(tmp_path)], jobs=1)
    assert [(f.code, f.severity) for f in report.findings] == [("DFD201", Severity.INFO)]
    assert report.findings[0].message.endswith(
        f"mitigated by threadlocal-flag ({tmp_path / 'main.py'}:3), non-lazy-backward ({tmp_path / 'main.py'}:4) "
        f"in the program of {tmp_path / 'main.py'} (imports {tmp_path / 'workers.py'})")
    assert [(a["mitigation"], a["line"]) for a in report.facts["mitigations_applied"]] == [
        ("threadlocal-flag", 3), ("non-lazy-backward", 4)]
    assert report.exit_code() == 0


def test_a_fix_in_a_file_that_does_not_import_the_threads_does_not_count(tmp_path):
    (tmp_path / "main.py").write_text(textwrap.dedent(README_FIX))
    (tmp_path / "workers.py").write_text(textwrap.dedent(THREADS))
    report = scan_paths([str(tmp_path)], jobs=1)
    [finding] = report.findings
    assert finding.severity is Severity.ERROR
    assert finding.message.endswith(
        f"not mitigated in the program of {tmp_path / 'workers.py'} (its own file (nothing scanned imports it)): "
        f"threadlocal-flag ({tmp_path / 'main.py'}:3), non-lazy-backward ({tmp_path / 'main.py'}:4): "
        "not part of this program")
    assert report.exit_code() == 1


@pytest.mark.timeout(180)
def test_new_user_adds_the_readme_fix_and_scan_and_check_pass(cli, tmp_path):
    train = tmp_path / "train.py"
    train.write_text(textwrap.dedent(THREADS))
    before = cli("scan", train, "--format", "json")
    assert before.returncode == 1
    train.write_text(textwrap.dedent(README_FIX) + textwrap.dedent(THREADS))
    after = cli("scan", train, "--format", "json")
    assert after.returncode == 0, after.stderr
    [finding] = json.loads(after.stdout)["findings"]
    assert (finding["code"], finding["severity"]) == ("DFD201", "info")
    assert "mitigated by threadlocal-flag" in finding["message"]
    check = cli("check", tmp_path, "--no-probes", "--format", "json", timeout=170)
    document = json.loads(check.stdout)
    assert check.returncode == 0, (check.stderr, [f for f in document["findings"] if f["severity"] != "info"])
    assert document["facts"]["environment_findings"].startswith("downgraded")
