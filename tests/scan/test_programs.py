"""A fix counts only for its program: several trainers in one tree, a trainer split over files, imports followed
within the project (and said when they cannot be), declared entry points, and check judging from the result."""
from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from dflash_doctor.check import CheckPlan, default_parts, run_check
from dflash_doctor.findings import FailOn, Report, Severity
from dflash_doctor.rules.guards import FX_FLAG_MODULE_GLOBAL
from dflash_doctor.rules.scan import COMPILED_CALL_IN_THREAD
from dflash_doctor.scan import scan_paths

REPO = Path(__file__).resolve().parents[2]
SEVERAL = REPO / "fixtures/scan/programs/several"
SPLIT = REPO / "fixtures/scan/programs/split"
DFD201 = COMPILED_CALL_IN_THREAD.code


def severities(report) -> list:
    return [(f.path.replace(os.sep, "/"), f.line, f.code, f.severity.value) for f in report.findings]


@pytest.mark.timeout(60)
def test_a_fixed_copy_of_a_trainer_does_not_mitigate_the_others(cli):
    run = cli("scan", ".", "--format", "json", "--no-config", cwd=SEVERAL, timeout=60)
    assert run.returncode == 1, run.stderr
    document = json.loads(run.stdout)
    assert [(f["path"], f["line"], f["code"], f["severity"]) for f in document["findings"]] == [
        ("mytrainer/train.py", 14, DFD201, "error"),
        ("mytrainer_fixed/train.py", 19, DFD201, "info"),
        ("train.py", 12, DFD201, "error"),
    ]
    unfixed, fixed, unrelated = document["findings"]
    assert fixed["message"].endswith(
        "; mitigated by threadlocal-flag (mytrainer_fixed/train.py:6), non-lazy-backward "
        "(mytrainer_fixed/train.py:7) in the program of mytrainer_fixed/train.py (__main__ guard)")
    assert unfixed["message"].endswith(
        "; not mitigated in the program of mytrainer/train.py (__main__ guard): threadlocal-flag "
        "(mytrainer_fixed/train.py:6), non-lazy-backward (mytrainer_fixed/train.py:7): not part of this program")
    assert unrelated["evidence"]["mitigations"]["programs"] == [{
        "entry": "train.py", "how": "its own file (nothing scanned imports it)", "mitigated": False,
        "applied": []}]
    assert [e["path"] for e in document["facts"]["entry_points"]] == [
        "mytrainer/train.py", "mytrainer_fixed/train.py"]


@pytest.mark.timeout(60)
def test_only_the_fixed_trainer_passes(cli):
    run = cli("scan", "mytrainer_fixed", "--format", "json", "--no-config", cwd=SEVERAL, timeout=60)
    assert run.returncode == 0, run.stderr
    assert [f["severity"] for f in json.loads(run.stdout)["findings"]] == ["info"]


@pytest.mark.timeout(60)
def test_scanning_one_file_follows_what_it_imports(cli):
    run = cli("scan", "train.py", "--format", "json", "--no-config", cwd=SPLIT, timeout=60)
    assert run.returncode == 1, run.stderr
    document = json.loads(run.stdout)
    [finding] = document["findings"]
    assert (finding["path"], finding["line"], finding["column"], finding["code"]) == ("train.py", 12, 5, DFD201)
    assert finding["evidence"]["chain"] == ["drafter (train.py:7)", "drafter_step (src/model.py:10)"]
    assert document["facts"]["followed_imports"] == ["src/model.py"]
    assert document["problems"] == []
    verbose = cli("scan", "train.py", "-v", "--no-config", cwd=SPLIT, timeout=60)
    assert "followed import: src/model.py" in verbose.stdout.splitlines()[1]


def _project(tmp_path: Path, files: dict) -> None:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


THREADS = """\
    import threading
    import torch
    from dflash_doctor import runtime

    step = torch.compile(lambda x: x * 2)


    def drafter(x):
        return step(x)


    def start():
        threading.Thread(target=drafter, args=(1,)).start()
"""


@pytest.mark.timeout(60)
def test_an_import_of_a_project_module_that_is_not_there_is_a_problem(cli, tmp_path):
    _project(tmp_path, {
        "pyproject.toml": "[project]\nname = 'x'\n",
        "train.py": "import torch\nimport numpy\nfrom pkg import real\nfrom pkg.gone import thing\n",
        "pkg/__init__.py": "", "pkg/real.py": "",
    })
    run = cli("scan", "train.py", "--format", "json", cwd=tmp_path, timeout=60)
    assert run.returncode == 4, run.stderr
    document = json.loads(run.stdout)
    assert document["problems"] == [{
        "subject": "train.py",
        "reason": "line 4: project import pkg.gone not followed: pkg is part of the project, pkg.gone is not there",
        "hint": "threads, compiled calls and fixes behind it were not judged; scan the folder that holds it, or "
                "declare the program in [tool.dflash-doctor] entry-points"}]
    assert document["facts"]["followed_imports"] == ["pkg/__init__.py", "pkg/real.py"]


def test_imports_are_not_followed_into_installed_packages_below_the_root(tmp_path):
    _project(tmp_path, {
        "pyproject.toml": "[project]\nname = 'x'\n",
        "train.py": "import vendored\n",
        ".venv/pyvenv.cfg": "", ".venv/lib/site-packages/vendored.py": "",
        "lib/site-packages/vendored/__init__.py": "",
    })
    report = scan_paths([str(tmp_path / "train.py")], jobs=1)
    assert report.facts["followed_imports"] == [] and report.problems == []


@pytest.mark.timeout(60)
def test_declared_entry_points_decide_the_programs(tmp_path):
    _project(tmp_path, {
        "pyproject.toml": "[tool.dflash-doctor]\nentry-points = ['app.cli:main']\n",
        "app/__init__.py": "",
        "app/cli.py": "from dflash_doctor import runtime\nfrom app import workers\n\n\ndef main():\n"
                      "    runtime.install_threadlocal_fx_flag()\n    runtime.enable_non_lazy_backward()\n"
                      "    workers.start()\n",
        "app/workers.py": THREADS,
    })
    from dflash_doctor.scan.config import resolve

    config = resolve([str(tmp_path)])
    report = scan_paths([str(tmp_path)], jobs=1, config=config)
    [finding] = report.findings
    assert finding.severity is Severity.INFO
    assert finding.message.endswith(f"in the program of {tmp_path / 'app/cli.py'} (declared in entry-points)")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value,message", [
    ("['nowhere.py']", "entry-points: 'nowhere.py' is neither a file nor a module under"),
    ("'train.py'", "entry-points must be a list of files"),
    ("[]", "entry-points must be a list of files"),
])
def test_bad_entry_points_are_one_line_and_exit_2(cli, tmp_path, value, message):
    _project(tmp_path, {"pyproject.toml": f"[tool.dflash-doctor]\nentry-points = {value}\n",
                        "runtime_fix.py": "from dflash_doctor import runtime\nruntime.warmup([])\n",
                        "workers.py": textwrap.dedent(THREADS) + "\nstart()\n"})
    run = cli("scan", ".", cwd=tmp_path, timeout=60)
    assert run.returncode == 2, run.stderr
    [line] = run.stderr.splitlines()
    assert message in line


def _check(paths, fail_on=FailOn.ERROR) -> int:
    """check with its real scan and a stand-in guards part that finds this torch's flag a module global (an
    error), as the real guards does on torch < 2.14: whether it stays an error depends on the scan's DFD201."""
    plan = CheckPlan(paths=[str(p) for p in paths], probes=False)
    guards = FX_FLAG_MODULE_GLOBAL.finding("the FX-tracing flag is a module global")
    parts = {"scan": default_parts(plan)["scan"], "guards": lambda: Report("guards", findings=[guards])}
    return run_check(plan, parts=parts).exit_code(fail_on)


@pytest.mark.timeout(60)
def test_check_fails_while_one_program_is_unfixed_and_passes_for_the_fixed_one():
    assert _check([SEVERAL]) == 1
    assert _check([SEVERAL / "mytrainer_fixed"]) == 0
    assert _check([SPLIT / "train.py"]) == 1
