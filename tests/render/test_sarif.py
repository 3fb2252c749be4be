"""SARIF 2.1.0 output: schema-valid, every rule described, repo-relative URIs, stable fingerprints, and a
location on every result (GitHub code scanning refuses a result without one)."""
from __future__ import annotations

from pathlib import Path

import pytest

from dflash_doctor.findings import Problem, Report
from dflash_doctor.render.rule_links import rule_anchor
from dflash_doctor.render.sarif import ENVIRONMENT_ARTIFACT, FINGERPRINT_KEY, render_sarif, sarif_document
from dflash_doctor.rules import all_rules, lookup
from tests.render.sarif_schema import assert_valid_sarif

REPO = Path(__file__).resolve().parents[2]


def _project(tmp_path: Path, manifest: bool = True) -> Path:
    (tmp_path / "src").mkdir(parents=True)
    (tmp_path / "src" / "train.py").write_text("x = 1\n")
    if manifest:
        (tmp_path / "requirements.txt").write_text("torch==2.13.0\n")
    return tmp_path


def _every_rule_report(root: Path) -> Report:
    """One finding of every registered rule: scan rules on a file, the others about the environment."""
    findings = []
    for rule in all_rules():
        if rule.example_format == "python":
            findings.append(rule.finding(path=str(root / "src" / "train.py"), line=3, column=5,
                                         evidence={"call": "checkpoint(f, x)"}))
        else:
            findings.append(rule.finding(evidence={"gpu": 5}))
    problems = [Problem("guards", "torch is not importable", "pip install torch")]
    return Report("check", findings=findings, problems=problems)


def _results(document: dict) -> list:
    return document["runs"][0]["results"]


def test_every_rule_as_a_finding_validates_and_is_described(tmp_path):
    root = _project(tmp_path)
    document = sarif_document(_every_rule_report(root), 5, root=root)
    assert_valid_sarif(document)
    driver = document["runs"][0]["tool"]["driver"]
    assert [r["id"] for r in driver["rules"]] == [r.code for r in all_rules()]
    for entry, rule in zip(driver["rules"], all_rules()):
        assert entry["name"] == rule.name
        assert entry["shortDescription"]["text"] == rule.summary
        assert entry["fullDescription"]["text"] == rule.rationale
        assert entry["helpUri"].endswith(f"docs/rules.md#{rule_anchor(rule)}")
        assert entry["defaultConfiguration"]["level"] == {"error": "error", "warning": "warning", "info": "note"}[
            rule.severity.value]
    assert len(_results(document)) == len(all_rules())


def test_file_findings_get_repo_relative_uris(tmp_path):
    root = _project(tmp_path)
    finding = lookup("DFD101").finding(path=str(root / "src" / "train.py"), line=7, column=12)
    [result] = _results(sarif_document(Report("scan", findings=[finding]), 1, root=root))
    location = result["locations"][0]["physicalLocation"]
    assert location["artifactLocation"] == {"uri": "src/train.py", "uriBaseId": "%SRCROOT%"}
    assert location["region"] == {"startLine": 7, "startColumn": 12}
    assert result["ruleId"] == "DFD101" and result["level"] == "warning"


def test_relative_paths_resolve_against_the_working_folder(tmp_path, monkeypatch):
    root = _project(tmp_path)
    monkeypatch.chdir(root / "src")
    finding = lookup("DFD101").finding(path="train.py", line=1, column=1)
    [result] = _results(sarif_document(Report("scan", findings=[finding]), 1, root=root))
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "src/train.py"


@pytest.mark.parametrize("manifest, expected", [(True, "requirements.txt"), (False, ENVIRONMENT_ARTIFACT)])
def test_environment_findings_are_placed_on_the_manifest_or_a_pseudo_artifact(tmp_path, manifest, expected):
    root = _project(tmp_path, manifest=manifest)
    finding = next(r for r in all_rules() if r.example_format != "python").finding(evidence={"gpu": 5})
    document = sarif_document(Report("check", findings=[finding]), 1, root=root)
    assert_valid_sarif(document)
    [result] = _results(document)
    location = result["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == expected
    assert location["region"] == {"startLine": 1}
    assert result["properties"]["environmentFinding"] is True


def test_environment_fingerprint_does_not_depend_on_the_placement(tmp_path):
    finding = next(r for r in all_rules() if r.example_format != "python").finding(evidence={"gpu": 5})
    with_manifest = _project(tmp_path / "a")
    without = _project(tmp_path / "b", manifest=False)
    prints = [
        _results(sarif_document(Report("check", findings=[finding]), 1, root=root))[0]["partialFingerprints"]
        for root in (with_manifest, without)
    ]
    assert prints[0] == prints[1]


def test_fingerprints_survive_line_shifts_and_differ_between_files(tmp_path):
    root = _project(tmp_path)
    rule = lookup("DFD101")

    def fingerprint(path, line):
        finding = rule.finding(path=str(root / path), line=line, column=1, evidence={"call": "checkpoint(f)"})
        return _results(sarif_document(Report("scan", findings=[finding]), 1, root=root))[0][
            "partialFingerprints"][FINGERPRINT_KEY]

    assert fingerprint("src/train.py", 10) == fingerprint("src/train.py", 14)
    assert fingerprint("src/train.py", 10) != fingerprint("src/other.py", 10)


def test_identical_findings_in_one_file_keep_distinct_fingerprints(tmp_path):
    root = _project(tmp_path)
    rule = lookup("DFD102")
    findings = [rule.finding(path=str(root / "src" / "train.py"), line=n, column=1) for n in (3, 9, 20)]
    document = sarif_document(Report("scan", findings=findings), 1, root=root)
    assert_valid_sarif(document)
    assert len({r["partialFingerprints"][FINGERPRINT_KEY] for r in _results(document)}) == 3


def test_problems_mark_the_invocation_unsuccessful(tmp_path):
    root = _project(tmp_path)
    report = Report("check", problems=[Problem("guards", "torch is not importable", "pip install torch")])
    document = sarif_document(report, 4, root=root)
    assert_valid_sarif(document)
    [invocation] = document["runs"][0]["invocations"]
    assert invocation["executionSuccessful"] is False and invocation["exitCode"] == 4
    assert invocation["toolExecutionNotifications"][0]["message"]["text"] == (
        "could not check guards: torch is not importable (pip install torch)")


def test_clean_report_is_valid_with_no_results(tmp_path):
    document = sarif_document(Report("scan"), 0, root=_project(tmp_path))
    assert_valid_sarif(document)
    assert _results(document) == []
    assert document["runs"][0]["invocations"][0]["executionSuccessful"] is True


def test_render_sarif_is_json_of_the_document(tmp_path, monkeypatch):
    import json

    root = _project(tmp_path)
    (root / ".git").mkdir()
    monkeypatch.chdir(root)
    finding = lookup("DFD101").finding(path="src/train.py", line=2, column=1, evidence={"obj": object()})
    document = json.loads(render_sarif(Report("scan", findings=[finding]), 1))
    assert_valid_sarif(document)
    assert document["runs"][0]["originalUriBaseIds"]["%SRCROOT%"]["uri"] == root.resolve().as_uri() + "/"



_MUTATIONS = {
    "bad version": lambda d: d.update(version="2.0.0"),
    "unknown property": lambda d: d["runs"][0].update(surprise=True),
    "level not in enum": lambda d: d["runs"][0]["results"][0].update(level="fatal"),
    "no location": lambda d: d["runs"][0]["results"][0].update(locations=[]),
    "unknown rule": lambda d: d["runs"][0]["results"][0].update(ruleId="DFD999"),
    "absolute uri": lambda d: d["runs"][0]["results"][0]["locations"][0]["physicalLocation"][
        "artifactLocation"].update(uri="/etc/passwd"),
}


@pytest.mark.parametrize("mutation", sorted(_MUTATIONS))
def test_the_checker_itself_rejects_broken_sarif(tmp_path, mutation):
    """Guard against a validator that passes everything: each mutation of a valid document must be caught."""
    root = _project(tmp_path)
    finding = lookup("DFD101").finding(path=str(root / "src" / "train.py"), line=7, column=12)
    document = sarif_document(Report("scan", findings=[finding]), 1, root=root)
    assert_valid_sarif(document)
    _MUTATIONS[mutation](document)
    with pytest.raises(AssertionError):
        assert_valid_sarif(document)


def test_findings_in_files_outside_the_repository_are_placed_like_environment_findings(tmp_path):
    root = _project(tmp_path / "project")
    outside = tmp_path / "site-packages" / "torch" / "compiler" / "__init__.py"
    outside.parent.mkdir(parents=True)
    outside.write_text("_is_compiling_flag = False\n")
    finding = lookup("DFD101").finding(path=str(outside), line=42, column=1)
    document = sarif_document(Report("guards", findings=[finding]), 1, root=root)
    assert_valid_sarif(document)
    [result] = _results(document)
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "requirements.txt"
    assert result["properties"]["originalLocation"] == f"{outside.resolve().as_uri()}:42"
    assert result["properties"]["environmentFinding"] is True
