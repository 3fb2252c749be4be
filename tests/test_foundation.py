"""The shared result model, registry and CLI contract every command relies on."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dflash_doctor.findings import EXIT_FINDINGS, EXIT_PROBLEMS, FailOn, Problem, Report, Severity
from dflash_doctor.render import OutputFormat
from dflash_doctor.render.json_format import envelope
from dflash_doctor.rules import all_rules, lookup
from dflash_doctor.rules.registry import Rule, register
from tests.conftest import REPO, run_cli


def _report(*severities, problems=0):
    rule = lookup("DFD101")
    findings = [rule.finding(severity=s, path="a.py", line=1, column=1) for s in severities]
    return Report("scan", findings=findings, problems=[Problem("x.py", "unreadable")] * problems)


@pytest.mark.parametrize(
    "severities, fail_on, problems, expected",
    [
        ((), FailOn.WARNING, 0, 0),
        ((Severity.INFO,), FailOn.WARNING, 0, 0),
        ((Severity.INFO,), FailOn.INFO, 0, EXIT_FINDINGS),
        ((Severity.WARNING,), FailOn.WARNING, 0, EXIT_FINDINGS),
        ((Severity.WARNING,), FailOn.ERROR, 0, 0),
        ((Severity.ERROR,), FailOn.NEVER, 0, 0),
        ((), FailOn.WARNING, 1, EXIT_PROBLEMS),
        ((Severity.ERROR,), FailOn.WARNING, 2, EXIT_FINDINGS | EXIT_PROBLEMS),
    ],
)
def test_exit_code_bits(severities, fail_on, problems, expected):
    assert _report(*severities, problems=problems).exit_code(fail_on) == expected


def test_json_envelope_has_the_contract_keys():
    doc = envelope(_report(Severity.WARNING, problems=1), 5)
    assert list(doc) == ["tool", "version", "command", "findings", "problems", "facts", "exit_code"]
    assert doc["findings"][0] == {
        "code": "DFD101", "name": "checkpoint-use-reentrant-true", "severity": "warning",
        "message": lookup("DFD101").summary, "path": "a.py", "line": 1, "column": 1, "evidence": {},
    }
    assert doc["problems"] == [{"subject": "x.py", "reason": "unreadable", "hint": ""}]
    assert doc["exit_code"] == 5
    json.dumps(doc)


def test_registry_codes_and_names_are_unique_and_wellformed():
    rules = all_rules()
    assert len({r.code for r in rules}) == len(rules)
    assert len({r.name for r in rules}) == len(rules)
    for rule in rules:
        assert rule.bad.strip() and rule.good.strip() and rule.rationale.strip(), rule.code
        assert lookup(rule.code) is rule and lookup(rule.name) is rule


def test_registering_a_duplicate_code_is_refused():
    existing = lookup("DFD101")
    with pytest.raises(ValueError):
        register(Rule(existing.code, "some-other-name", Severity.INFO, "s", "r", "b", "g"))
    with pytest.raises(ValueError):
        register(Rule("DFD999", existing.name, Severity.INFO, "s", "r", "b", "g"))


def test_python_bad_examples_mark_their_own_code():
    for rule in all_rules():
        if rule.example_format == "python":
            assert f"# {rule.code}" in rule.bad, rule.code
            assert f"# {rule.code}" not in rule.good, rule.code


def test_every_format_is_renderable():
    # the formats come from the enum (render/formats.py); these four are a public contract and never go away
    assert {"text", "json", "sarif", "junit"} <= {f.value for f in OutputFormat}


def test_explain_prints_each_rule_with_its_examples():
    proc = run_cli("explain", "--list", "--json", timeout=60)
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)
    assert [r["code"] for r in listed] == [r.code for r in all_rules()]
    one = json.loads(run_cli("explain", "checkpoint-use-reentrant-true", "--json", timeout=60).stdout)
    assert one["code"] == "DFD101" and one["bad"] == lookup("DFD101").bad and one["good"] == lookup("DFD101").good


def test_unknown_rule_is_one_line_and_exit_2():
    proc = run_cli("explain", "DFD000", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "unknown rule" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, says", [
    (("explain", "--no-such-option"), "No such option: --no-such-option"),
    (("scan",), "Missing argument"),
    (("scan", ".", "--format", "yaml"), "'yaml' is not one of"),
    (("no-such-command",), "No such command"),
])
def test_click_usage_errors_are_one_line_and_exit_2(args, says):
    proc = run_cli(*args, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("dflash-doctor: error: ") and says in proc.stderr
    assert "--help" in proc.stderr  # where to look next


def test_no_arguments_prints_the_help():
    proc = run_cli(timeout=60)
    assert "Usage: dflash-doctor" in proc.stdout + proc.stderr and "repro" in proc.stdout + proc.stderr


def test_help_and_explain_do_not_import_torch():
    for args in (("--help",), ("explain", "DFD201")):
        out = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "dflash_doctor", *args],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line}
        assert not {m for m in imported if m == "torch" or m.startswith("torch.")}, args
        assert "pynvml" not in imported


def test_every_rule_examples_format_is_run_by_its_domain_tests():
    # Each format's examples run in one domain's tests (scan, gpus, logs, guards, repro); a new format with no
    # runner would leave its examples untested, so the set is pinned here.
    from dflash_doctor.rules.registry import EXAMPLE_FORMATS

    used = {rule.example_format for rule in all_rules()}
    assert used == set(EXAMPLE_FORMATS)
    by_prefix = {"DFD1": "python", "DFD2": "python", "DFD3": "python", "DFD4": "nvidia-smi-csv", "DFD5": "log",
                 "DFD7": "repro-facts", "DFD8": "pipeline-facts", "DFD9": "live-facts"}
    for rule in all_rules():
        expected = by_prefix.get(rule.code[:4])
        assert rule.example_format in ((expected,) if expected else ("torch-layout", "guards-state")), rule.code


def test_a_rule_with_an_unknown_example_format_is_refused():
    with pytest.raises(ValueError, match="example format"):
        register(Rule("DFD998", "made-up-format", Severity.INFO, "s", "r", "b", "g", example_format="yaml"))


def test_enum_options_are_annotated_in_every_command():
    # An unannotated `fail_on=FAIL_ON_OPTION` reaches the command as the string 'FailOn.WARNING' under typer 0.27
    # on Python 3.12 (the H200 image), which crashed `pipeline` after 30 steps of training.
    import typing

    from dflash_doctor.cli import register_commands

    app = register_commands()
    from dflash_doctor.commands.common import FAIL_ON_OPTION, FORMAT_OPTION
    from dflash_doctor.findings import FailOn
    from dflash_doctor.render import OutputFormat

    checked = 0
    for command in app.registered_commands:
        hints = typing.get_type_hints(command.callback)
        for name, parameter in __import__("inspect").signature(command.callback).parameters.items():
            expected = {id(FORMAT_OPTION): OutputFormat, id(FAIL_ON_OPTION): FailOn}.get(id(parameter.default))
            if expected is not None:
                assert hints.get(name) is expected, f"{command.callback.__name__}: {name}"
                checked += 1
    assert checked >= 10


def test_a_command_line_loads_only_the_command_it_names():
    from dflash_doctor.cli import COMMANDS, commands_for

    assert commands_for(["scan", "train.py"]) == ("scan",)
    assert commands_for(["--debug", "repro", "--threads", "3"]) == ("repro",)
    assert commands_for(["--help"]) == commands_for([]) == commands_for(["scna"]) == COMMANDS
    proc = run_cli("--debug", "explain", "DFD201", timeout=60)  # the root's own option before the command
    assert proc.returncode == 0 and "DFD201" in proc.stdout
    proc = run_cli("scna", timeout=60)  # a typo still gets click's suggestion, from the full command list
    assert proc.returncode == 2 and "Did you mean 'scan'?" in proc.stderr
