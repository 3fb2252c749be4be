"""Text from outside is shown escaped: no forged lines, no terminal control, undecodable bytes visible."""
from __future__ import annotations

import io
import os

import pytest

from dflash_doctor.printable import printable, printable_log, without_surrogates
from dflash_doctor.render.text import console_for


@pytest.mark.parametrize("raw, shown", [
    ("a.py\nfake.py:1:1: DFD101", "a.py\\nfake.py:1:1: DFD101"),
    ("a\r.py", "a\\r.py"),
    ("\x1b[2J\x1b]0;title\x07.py", "\\x1b[2J\\x1b]0;title\\x07.py"),
    ("\x9b31m.py", "\\x9b31m.py"),  # the one-byte CSI
    ("admin\u202eexe.py", "admin\\u202eexe.py"),
    ("line\u2028sep", "line\\u2028sep"),
    (os.fsdecode(b"caf\xe9.py"), "caf\\xe9.py"),
    ("tab\tstays, unicode stays: café ✓", "tab\tstays, unicode stays: café ✓"),
])
def test_printable(raw, shown):
    assert printable(raw) == shown


def test_newlines_can_be_kept_for_laid_out_text():
    assert printable("row 1\x1b[A\nrow 2", keep_newlines=True) == "row 1\\x1b[A\nrow 2"


def test_log_text_has_its_controls_escaped_tabs_too_and_the_rest_kept():
    # What logs/ copies from a log (or a log's name): C0/C1 controls and tab escaped, surrogates and bidi kept.
    raw = "a\tb\x1b[2J\n\x9b" + os.fsdecode(b"\xff") + "\u202e"
    assert printable_log(raw) == "a\\tb\\x1b[2J\\n\\x9b" + os.fsdecode(b"\xff") + "\u202e"
    assert printable(raw, controls_only=True) == printable_log(raw)


def test_without_surrogates_keeps_everything_else():
    assert without_surrogates(os.fsdecode(b"\xff-\x1b-caf\xc3\xa9")) == "\\xff-\x1b-café"


def test_every_string_a_console_draws_is_escaped():
    from rich.table import Table

    buffer = io.StringIO()
    console = console_for(buffer)
    table = Table()
    table.add_column("name\x1b[31m")
    table.add_row("cell\x1b[2J")
    console.print("printed \x1b]8;;http://evil\x07link :fire:")
    console.print(table)
    text = buffer.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b[2J" in text and ":fire:" in text  # and no emoji substitution
