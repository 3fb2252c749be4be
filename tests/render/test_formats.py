"""The format registry: every OutputFormat has its own formatter (none falls through to another's output),
each writes a document of its kind, and the terminal-facing text escapes what it shows."""
from __future__ import annotations

import io
import pytest

from dflash_doctor.findings import FailOn, Problem, Report
from dflash_doctor.render import OutputFormat, emit, formatter_for
from dflash_doctor.render.formats import FORMATTERS, Formatter
from dflash_doctor.rules import lookup


def _report() -> Report:
    finding = lookup("DFD101").finding(path="train.py", line=2, column=1)
    return Report("scan", findings=[finding], problems=[Problem("x.py", "unreadable")])


@pytest.mark.parametrize("fmt", list(OutputFormat))
def test_every_format_has_its_own_formatter_and_document(fmt):
    formatter = formatter_for(fmt)
    assert isinstance(formatter, Formatter) and formatter.suffix.startswith(".")
    out, err = io.StringIO(), io.StringIO()
    code = emit(_report(), fmt, FailOn.WARNING, out=out, err=err)
    assert code == 5
    # each formatter reads its own document back as its format (JSON through json, JUnit through ElementTree...)
    assert formatter.codes(out.getvalue()) == ["DFD101"]
    assert "could not check x.py" in err.getvalue() and "(exit 5)" in err.getvalue()


def test_formatters_are_distinct_and_suffixes_unique():
    formatters = [type(formatter_for(fmt)) for fmt in OutputFormat]
    assert len(set(formatters)) == len(formatters)
    assert len({f.suffix for f in formatters}) == len(formatters)


def test_every_member_of_the_enum_is_mapped_to_a_formatter_of_its_own():
    assert set(FORMATTERS) == set(OutputFormat)


def test_an_unknown_format_is_an_error_not_another_format():
    with pytest.raises(AssertionError, match="unhandled"):
        formatter_for("yaml")  # type: ignore[arg-type]
