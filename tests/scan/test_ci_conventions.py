"""What ruff and semgrep taught users, from the CLI as they run it: pyproject configuration, baselines that
survive line moves, --statistics, -q/-v and unused noqa."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from dflash_doctor.errors import UsageError
from dflash_doctor.scan import scan_paths
from dflash_doctor.scan.config import ScanConfig, find, load, resolve

BAD = "from torch.utils.checkpoint import checkpoint\ncheckpoint(f, x)\n"
pytestmark = pytest.mark.timeout(120)


def project(root: Path, table: str = "") -> Path:
    for folder in ("src", "tests", "gen"):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "mod.py").write_text(BAD)
    (root / "pyproject.toml").write_text('[project]\nname = "demo"\n\n' + textwrap.dedent(table))
    return root


def located(document: dict) -> list:
    return sorted((f["path"], f["line"], f["code"]) for f in document["findings"])


def test_pyproject_is_found_upward_and_applies(cli, tmp_path):
    project(tmp_path, """\
        [tool.dflash-doctor]
        exclude = ["gen"]
        per-file-ignores = { "tests/*" = ["checkpoint-use-reentrant-implicit"] }
        fail-on = "error"
    """)
    run = cli("scan", "src", "tests", "gen", "--format", "json", cwd=tmp_path)
    document = json.loads(run.stdout)
    assert located(document) == [("src/mod.py", 2, "DFD102")]
    assert document["facts"]["config"] == str(tmp_path / "pyproject.toml")
    assert document["facts"]["ignored_by_per_file_ignores"] == 1
    assert run.returncode == 0  # fail-on = "error" from the file
    assert cli("scan", "src", "--fail-on", "warning", cwd=tmp_path).returncode == 1  # the option wins
    isolated = cli("scan", ".", "--no-config", "--format", "json", cwd=tmp_path)
    assert len(json.loads(isolated.stdout)["findings"]) == 3 and isolated.returncode == 1


def test_a_pyproject_without_the_table_is_passed_over(tmp_path):
    outer = project(tmp_path, "[tool.dflash-doctor]\nignore = [\"DFD1\"]\n")
    inner = outer / "sub"
    inner.mkdir()
    (inner / "pyproject.toml").write_text("[tool.ruff]\nline-length = 100\n")
    (inner / "x.py").write_text(BAD)
    assert find([str(inner / "x.py")]) == str(outer / "pyproject.toml")
    assert scan_paths([str(inner)], jobs=1, config=resolve([str(inner)])).findings == []


@pytest.mark.parametrize("table,message", [
    ('bogus = 1\n', "unknown key 'bogus' in [tool.dflash-doctor]; known keys: select, ignore, exclude, fail-on, "
                    "per-file-ignores"),
    ('select = "DFD1"\n', "select must be a list of rule codes, prefixes or names, not 'DFD1'"),
    ('fail-on = "sometimes"\n', "fail-on must be one of error, warning, info, never, not 'sometimes'"),
    ('select = [\n', "is not valid TOML"),
])
def test_bad_configuration_is_one_line_and_exit_2(cli, tmp_path, table, message):
    project(tmp_path, "[tool.dflash-doctor]\n" + table)
    run = cli("scan", "src", cwd=tmp_path)
    assert run.returncode == 2
    [line] = run.stderr.strip().splitlines()
    assert line.startswith(f"dflash-doctor: error: {tmp_path / 'pyproject.toml'}")
    assert message in line


def test_select_that_names_no_rule_in_config_is_an_error(tmp_path):
    project(tmp_path, "[tool.dflash-doctor]\nselect = []\n")
    with pytest.raises(UsageError, match="names no rule"):
        scan_paths([str(tmp_path)], config=load(str(tmp_path / "pyproject.toml")))


def test_check_uses_the_same_configuration(cli, tmp_path):
    project(tmp_path, '[tool.dflash-doctor]\nexclude = ["gen", "tests"]\n')
    run = cli("check", ".", "--no-probes", "--format", "json", cwd=tmp_path, timeout=110)
    scan_findings = [f for f in json.loads(run.stdout)["findings"] if f["code"].startswith(("DFD1", "DFD2"))]
    assert [(f["path"], f["code"]) for f in scan_findings] == [("src/mod.py", "DFD102")]


def test_baseline_survives_line_moves_and_catches_new_findings(cli, tmp_path):
    target = tmp_path / "train.py"
    target.write_text("import torch\nfrom torch.utils.checkpoint import checkpoint\n\ncheckpoint(f, x)\n")
    first = cli("scan", ".", "--format", "json", "-o", "baseline.json", "--no-config", cwd=tmp_path)
    assert first.returncode == 1
    # Code moves down and is re-indented; one new finding appears.
    target.write_text("import torch\nfrom torch.utils.checkpoint import checkpoint\n\n\nif True:\n"
                      "    checkpoint(f,  x)\n    checkpoint(g, y, use_reentrant=True)\n")
    again = cli("scan", ".", "--baseline", "baseline.json", "--format", "json", "--no-config", cwd=tmp_path)
    document = json.loads(again.stdout)
    assert located(document) == [("train.py", 7, "DFD101")]
    assert document["facts"]["baseline"] == {"file": "baseline.json", "matched": 1, "new": 1, "fixed": 0}
    assert again.returncode == 1
    target.write_text("from torch.utils.checkpoint import checkpoint\ncheckpoint(f, x)\n")
    clean = cli("scan", ".", "--baseline", "baseline.json", "--no-config", cwd=tmp_path)
    assert clean.returncode == 0, clean.stderr


def test_bad_baseline_is_a_usage_error(cli, tmp_path):
    (tmp_path / "a.py").write_text(BAD)
    (tmp_path / "junk.json").write_text("[1, 2]")
    run = cli("scan", ".", "--baseline", "junk.json", cwd=tmp_path)
    assert run.returncode == 2
    assert run.stderr.strip() == (
        "dflash-doctor: error: --baseline junk.json: not a dflash-doctor JSON report (no findings list); write one "
        "with `dflash-doctor scan PATH --format json --output FILE`")


def test_statistics_quiet_and_verbose(cli, tmp_path):
    project(tmp_path)
    (tmp_path / "src" / "noqa.py").write_text(
        "from torch.utils.checkpoint import checkpoint\ncheckpoint(f, x, use_reentrant=False)  # noqa: DFD102\n")
    stats = cli("scan", ".", "--statistics", cwd=tmp_path)
    assert stats.returncode == 1
    assert [line.split() for line in stats.stdout.splitlines()] == [
        ["3", "DFD102", "checkpoint-use-reentrant-implicit"], ["1", "DFD302", "unused-noqa"]]
    as_json = cli("scan", ".", "--statistics", "--format", "json", cwd=tmp_path)
    assert json.loads(as_json.stdout)["facts"]["statistics"] == {"DFD102": 3, "DFD302": 1}
    quiet = cli("scan", ".", "-q", cwd=tmp_path)
    assert quiet.returncode == 1 and quiet.stderr == "" and len(quiet.stdout.splitlines()) == 4
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr\n")
    verbose = cli("scan", ".", "-v", cwd=tmp_path)
    assert "skipped venv: virtual environment (pyvenv.cfg)" in verbose.stdout.splitlines()
    assert cli("scan", ".", "-q", "-v", cwd=tmp_path).returncode == 2


def test_unused_noqa_in_a_file_the_prefilter_skips(tmp_path):
    (tmp_path / "plain.py").write_text("x = 1  # noqa: DFD201\n")
    report = scan_paths([str(tmp_path)], jobs=1, config=ScanConfig())
    assert [(f.code, f.line, f.column) for f in report.findings] == [("DFD302", 1, 8)]
    assert scan_paths([str(tmp_path)], jobs=1, select="DFD1").findings == []  # DFD201 did not run: not judged
