"""Help pages a user can paste from: every example on one unbroken line, words broken only at spaces, plain
usage lines, and defaults that say what the code does."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from dflash_doctor import cli
from dflash_doctor.render.help import epilog, examples_of

WIDTHS = (40, 80, 200)


def _commands():
    group = typer.main.get_command(cli.register_commands())
    return group, {name: group.commands[name] for name in cli.COMMANDS}


def _help(args, width: int) -> str:
    result = CliRunner().invoke(cli.register_commands(), [*args, "--help"], env={"COLUMNS": str(width)},
                                terminal_width=width, prog_name="dflash-doctor")
    assert result.exit_code == 0, result.output
    return result.output


def test_every_command_declares_examples():
    group, commands = _commands()
    assert examples_of(group.epilog or "")
    for name, command in commands.items():
        examples = examples_of(command.epilog or "")
        assert examples, f"{name}: its epilog has no examples (build it with render.help.epilog)"
        assert all(example.startswith(("dflash-doctor ", "nvidia-smi ", "ssh ")) for example in examples), name


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", ("", *cli.COMMANDS))
def test_examples_appear_unbroken_at_every_width(name, width):
    group, commands = _commands()
    command = commands[name] if name else group
    lines = [line.strip() for line in _help([name] if name else [], width).splitlines()]
    for example in examples_of(command.epilog or ""):
        assert example in lines, f"{name or 'root'} at {width} columns: {example!r} is not on a line of its own"


@pytest.mark.parametrize("name", ("", *cli.COMMANDS))
def test_words_break_only_at_spaces_and_usage_is_plain(name):
    text = _help([name] if name else [], 80)
    # A line ending in letter-hyphen is a word cut in two (`dflash-` / `doctor`, `threadlocal-` / `flag`).
    assert not [line for line in text.splitlines() if re.search(r"[A-Za-z]-$", line)], text
    usage = text.splitlines()[0]
    assert usage.startswith(f"Usage: dflash-doctor {name}".rstrip()), usage
    assert "{" not in usage and "}" not in usage, usage


def test_scan_usage_names_its_paths():
    assert _help(["scan"], 80).splitlines()[0] == "Usage: dflash-doctor scan [OPTIONS] PATH..."


def test_jobs_default_is_said_alike_in_help_and_readme():
    from dflash_doctor.repro.spec import default_jobs
    from dflash_doctor.vocabularies import JOBS_DEFAULT_TEXT

    assert f"Default: {JOBS_DEFAULT_TEXT}." in " ".join(_help(["repro"], 200).split())
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert f"default {JOBS_DEFAULT_TEXT}" in readme
    # and the words describe the function: one a core on a CPU; half the cores with a GPU; at most 8
    assert default_jobs(("cpu",), 1) == 1 and default_jobs(("cpu",), 2) == 2 and default_jobs(("cpu",), 16) == 8
    assert default_jobs(("cuda",), 6) == 3 and default_jobs(("cuda",), 64) == 8 and default_jobs(("cuda",), 1) == 1


def test_epilog_refuses_an_example_that_is_not_one_line():
    with pytest.raises(ValueError):
        epilog(["dflash-doctor scan\nsrc/"])
    assert examples_of("prose, not an epilog") == []
