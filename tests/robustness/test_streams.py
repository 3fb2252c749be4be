"""Closed standard streams are a usage condition, never an internal error: every command (read from the app)
started with stdout closed (`>&-`) is one line and exit 2, as is `--help >&-`; `-` with stdin closed
(`<&-`) is one line and exit 2 (test_inputs.py, for every input that takes `-`); with stderr closed
(`2>&-`) the exit code is still the documented one, and no file the command opens takes a closed number."""
from __future__ import annotations

import json

import pytest

from tests.robustness.harness import assert_one_error_line, commands, required_args, run


@pytest.mark.parametrize("command", sorted(commands()))
def test_every_command_with_stdout_closed_is_one_line(tmp_path, command):
    result = run(command, *required_args(command, tmp_path), cwd=tmp_path, timeout=30, closed=(1,))
    assert_one_error_line(result, 2, "standard output is closed")


def test_help_with_stdout_closed_is_one_line(tmp_path):
    assert_one_error_line(run("--help", cwd=tmp_path, closed=(1,)), 2, "standard output is closed")


@pytest.mark.parametrize("args, code", [(["scan", "/nonexistent"], 2), (["scan", "{d}/t.py"], 1),
                                        (["explain", "DFD000"], 2)])
def test_stderr_closed_keeps_the_exit_code(tmp_path, args, code):
    (tmp_path / "t.py").write_text("import torch\ntorch.utils.checkpoint.checkpoint(f, x)\n", encoding="utf-8")
    result = run(*[a.format(d=tmp_path) for a in args], cwd=tmp_path, closed=(2,))
    assert result.returncode == code, result


def test_with_stdin_and_stderr_closed_the_report_still_goes_to_stdout_only(tmp_path):
    """Files opened later (the -o temporary, the config) must not land on descriptors 0 or 2."""
    source = tmp_path / "t.py"
    source.write_text("import torch\ntorch.utils.checkpoint.checkpoint(f, x)\n", encoding="utf-8")
    result = run("scan", source, "-f", "json", "-o", tmp_path / "r.json", cwd=tmp_path, closed=(0, 2))
    assert result.returncode == 1, result
    assert [f["code"] for f in json.loads((tmp_path / "r.json").read_text())["findings"]] == ["DFD102"]
    assert result.stdout == ""
