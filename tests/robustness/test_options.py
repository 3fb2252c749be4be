"""Every option is validated at the edge: NaN and infinity for every float option of every command (read
from the typer app, so a new one is covered without editing this file), unknown enum values, empty selections;
each is one line with exit 2 before any work starts, and --debug adds the traceback without changing the code."""
from __future__ import annotations

import inspect

import pytest

from tests.robustness.harness import (
    assert_one_error_line,
    commands,
    duration_options,
    float_options,
    processes_in,
    required_args,
    run,
)


def test_the_float_options_are_found():
    found = float_options()
    # A sample that must be there; the list itself comes from the app.
    assert {("repro", "--timeout"), ("pipeline", "--stall-timeout"), ("gpus", "--idle-util"),
            ("logs", "--max-seconds"), ("report", "--timeout")} <= set(found)


@pytest.mark.parametrize("value", ["nan", "inf"])
@pytest.mark.parametrize("command, option", float_options())
def test_every_float_option_refuses_non_finite_numbers(tmp_path, command, option, value):
    result = run(command, *required_args(command, tmp_path), f"{option}={value}", cwd=tmp_path, timeout=30)
    assert_one_error_line(result, 2, option)


def _options_with(name: str):
    found = []
    for command, callback in commands().items():
        for parameter in inspect.signature(callback).parameters.values():
            if name in (getattr(parameter.default, "param_decls", None) or ()):
                found.append(command)
    return found


@pytest.mark.parametrize("option", ["--format", "--fail-on"])
def test_unknown_enum_values_are_one_line(tmp_path, option):
    for command in _options_with(option):
        result = run(command, *required_args(command, tmp_path), option, "bogus", cwd=tmp_path, timeout=30)
        assert_one_error_line(result, 2, option, "'bogus'")


@pytest.mark.parametrize("args", [
    ["scan", "{d}/train.py", "--select", ",,,"],
    ["scan", "{d}/train.py", "--select", ""],
    ["scan", "{d}/train.py", "--ignore", ",,,"],
    ["status", "--log", "{d}/run.log", "--map", ","],
    ["logs", "{d}/run.log", "--thread-pattern", ""],
    ["repro", "--device", ""],
    ["repro", "--device", "cpu", "--mitigation", ","],
    ["gpus", "--from", "{d}/run.log", "--roles", ","],
    ["pipeline", "--device", "cpu", "--target-devices", ","],
    ["explain", ""],
    ["explain", "DFD101", "--list"],
])
def test_empty_or_contradictory_selections_are_usage_errors(tmp_path, args):
    required_args("logs", tmp_path)  # writes run.log and train.py
    result = run(*[a.format(d=tmp_path) for a in args], cwd=tmp_path, timeout=6)
    assert_one_error_line(result, 2)


def test_debug_adds_the_traceback_and_keeps_the_exit_code(tmp_path):
    plain = run("scan", tmp_path / "missing.py", timeout=30)
    debug = run("--debug", "scan", tmp_path / "missing.py", timeout=30)
    assert plain.returncode == debug.returncode == 2
    assert "Traceback" not in plain.stderr and "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.splitlines()[-1] == plain.stderr.splitlines()[-1]


@pytest.mark.parametrize("command, option", duration_options())
def test_every_duration_is_bounded(tmp_path, command, option):
    """1e300 s (or 1e19) is no timeout but an overflow in the deadline arithmetic: one line naming the cap,
    before any probe or child starts."""
    from dflash_doctor.commands.common import DURATION_OPTIONS, MAX_DURATION_S

    result = run(command, *required_args(command, tmp_path), option, "1e300", cwd=tmp_path, timeout=30)
    assert_one_error_line(result, 2, option, f"at most {MAX_DURATION_S / DURATION_OPTIONS[option]:g}")
    assert not processes_in(tmp_path), "a child was started"
