"""Help epilogs: each example on a line of its own, never rewrapped, so it can be pasted as it is shown.

click rewraps an epilog as prose, and its wrapper breaks at hyphens, so `dflash-doctor` or `--drafter-devices`
came out split over two lines. A paragraph whose first line is click's `\\b` marker is written as it stands: the
examples go in one such paragraph, the notes follow as ordinary paragraphs that may wrap. `examples_of` reads
them back, so the test that every example appears unbroken in `--help` needs no second list of them.
"""
from __future__ import annotations

import re
from typing import Any, List, Optional, Sequence, Tuple

import typer.core

NO_REWRAP = "\b"  # click.formatting: a paragraph starting with this line is not rewrapped
HEADING = "Examples:"
INDENT = "  "


def epilog(examples: Sequence[str], *notes: str) -> str:
    """An epilog: the examples one per line under `Examples:`, then each note as a paragraph of its own."""
    if not examples or any("\n" in example or not example.strip() for example in examples):
        raise ValueError("an example is one non-empty line")
    block = "\n".join([NO_REWRAP, HEADING, *(INDENT + example for example in examples)])
    return "\n\n".join([block, *(note for note in notes if note)])


def examples_of(text: str) -> List[str]:
    """The examples an epilog holds: the indented lines of its unwrapped `Examples:` paragraph, wherever it
    stands (`epilog` puts it first); none when it has no such paragraph."""
    lines = text.split("\n")
    starts = [i for i in range(len(lines) - 1) if lines[i:i + 2] == [NO_REWRAP, HEADING]]
    if not starts:
        return []
    found = []
    for line in lines[starts[0] + 2:]:
        if not line.startswith(INDENT):
            break
        found.append(line[len(INDENT):])
    return found


# click's wrapper breaks words at hyphens (`--drafter-` / `devices`); a non-breaking hyphen stands in for each
# one while a help page is laid out and is turned back before it is shown, so words break only at spaces.
_HELD_HYPHEN = "\u2011"


def _hold(text: str) -> str:
    return text.replace("-", _HELD_HYPHEN)


# Typer vendors click in some releases: the base classes are taken from typer, whichever click that is.
_ContextBase: Any = typer.core.TyperCommand.context_class
_FormatterBase: Any = _ContextBase.formatter_class


class _UnbrokenFormatter(_FormatterBase):
    def write_usage(self, prog: str, args: str = "", prefix: Optional[str] = None) -> None:
        super().write_usage(_hold(prog), _hold(args), prefix)

    def write_text(self, text: str) -> None:
        super().write_text(_hold(text))

    def write_dl(self, rows: Sequence[Tuple[str, str]], *args: Any, **kwargs: Any) -> None:
        super().write_dl([(_hold(term), _hold(text)) for term, text in rows], *args, **kwargs)

    def getvalue(self) -> str:
        return super().getvalue().replace(_HELD_HYPHEN, "-")


class _Context(_ContextBase):
    formatter_class = _UnbrokenFormatter


_REQUIRED = re.compile(r"\{(?P<name>[^{}]+)\}")


class HelpCommand(typer.core.TyperCommand):
    """A command whose help pages break lines only at spaces and whose usage line names its arguments plainly
    (typer writes a required one as `{paths}...`, which reads like a set; here it is `PATH...`)."""

    context_class = _Context

    def collect_usage_pieces(self, ctx: Any) -> List[str]:  # a click Context
        return [_REQUIRED.sub(r"\g<name>", piece) for piece in super().collect_usage_pieces(ctx)]


class HelpGroup(typer.core.TyperGroup):
    """The root command's help, laid out as its commands' are."""

    context_class = _Context
