"""The format registry: every OutputFormat has its own formatter (none falls through to another's output),
each writes a document of its kind, and the terminal-facing text escapes what it shows."""
from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET

import pytest

from dflash_doctor.findings import FailOn, Problem, Report
from dflash_doctor.render import OutputFormat, assert_never, emit, formatter_for
from dflash_doctor.render.formats import Formatter
from dflash_doctor.rules import lookup


def _report() -> Report:
    finding = lookup("DFD101").finding(path="train.py", line=2, column=1)
    return Report("scan", findings=[finding], problems=[Problem("x.py", "unreadable")])


def _parse(fmt: OutputFormat, text: str):
    """Reads `text` as the document `fmt` promises; a format without a reader here fails the test."""
    if fmt is OutputFormat.TEXT:
        return text.splitlines()
    if fmt is OutputFormat.JSON:
        return json.loads(text)["findings"][0]["code"]
    if fmt is OutputFormat.SARIF:
        return json.loads(text)["runs"][0]["results"][0]["ruleId"]
    if fmt is OutputFormat.JUNIT:
        return ET.fromstring(text).find("testsuite/testcase").get("classname")
    assert_never(fmt)


@pytest.mark.parametrize("fmt", list(OutputFormat))
def test_every_format_has_its_own_formatter_and_document(fmt):
    formatter = formatter_for(fmt)
    assert isinstance(formatter, Formatter) and formatter.suffix.startswith(".")
    out, err = io.StringIO(), io.StringIO()
    code = emit(_report(), fmt, FailOn.WARNING, out=out, err=err)
    assert code == 5
    parsed = _parse(fmt, out.getvalue())
    assert "DFD101" in (parsed if isinstance(parsed, str) else " ".join(parsed))
    assert "could not check x.py" in err.getvalue() and "(exit 5)" in err.getvalue()


def test_formatters_are_distinct_and_suffixes_unique():
    formatters = [type(formatter_for(fmt)) for fmt in OutputFormat]
    assert len(set(formatters)) == len(formatters)
    assert len({f.suffix for f in formatters}) == len(formatters)


def test_an_unknown_format_is_an_error_not_another_format():
    with pytest.raises(AssertionError, match="unhandled"):
        formatter_for("yaml")  # type: ignore[arg-type]
