"""The output formats, declared here only: `OutputFormat` (every command's `--format` choices) and one formatter
per format (pip-audit's `_format/` shape), each writing a report to `out` and its problems and summary line to
`err`. `FORMATTERS` maps every member to its formatter and is checked exhaustive at import, so a format added to
the enum without a formatter fails at once instead of falling through to another format's output.
`render.formatter_for` picks one; `suffix` names a file of that format; `codes` reads a document back (the tests'
proof that it is of its kind: tests/render/test_formats.py). Adding a format is a member, a formatter class and
its FORMATTERS entry, here; the lists of formats in the README and docs are regenerated from the enum
(render/doc_lists.py)."""
from __future__ import annotations

import abc
import enum
import re
from typing import TYPE_CHECKING, Any, ClassVar, Dict, List, Optional, TextIO, Type

from dflash_doctor.findings import FailOn, Report

if TYPE_CHECKING:
    from dflash_doctor.render import FactsView


class OutputFormat(str, enum.Enum):
    TEXT = "text"
    JSON = "json"
    SARIF = "sarif"
    JUNIT = "junit"


class Formatter(abc.ABC):
    suffix: ClassVar[str]

    @abc.abstractmethod
    def write(self, report: Report[Any], out: TextIO, err: TextIO, *, exit_code: int, fail_on: FailOn,
              facts_view: Optional[FactsView[Any]] = None) -> None:
        """Write the report to `out`, problems and the summary line to `err`."""

    @staticmethod
    @abc.abstractmethod
    def codes(document: str) -> List[str]:
        """The finding codes a reader of this format finds in what `write` put on `out` (parsing it as that
        format: a JSON formatter's reader fails on anything but JSON)."""


_CODE = re.compile(r"\bDFD\d{3}\b")


class TextFormatter(Formatter):
    suffix = ".txt"

    def write(self, report: Report[Any], out: TextIO, err: TextIO, *, exit_code: int, fail_on: FailOn,
              facts_view: Optional[FactsView[Any]] = None) -> None:
        from dflash_doctor.render.text import render_text

        render_text(report, out, err, facts_view=facts_view, exit_code=exit_code)

    @staticmethod
    def codes(document: str) -> List[str]:
        return _CODE.findall(document)


class DocumentFormatter(Formatter):
    """A machine-readable document on `out`; the human summary still goes to `err`."""

    @abc.abstractmethod
    def document(self, report: Report, exit_code: int, fail_on: Optional[FailOn]) -> str:
        """The whole document, without a trailing newline."""

    def write(self, report: Report[Any], out: TextIO, err: TextIO, *, exit_code: int, fail_on: FailOn,
              facts_view: Optional[FactsView[Any]] = None) -> None:
        from dflash_doctor.render.text import render_problems_and_summary

        out.write(self.document(report, exit_code, fail_on))
        out.write("\n")
        render_problems_and_summary(report, err, exit_code)


class JsonFormatter(DocumentFormatter):
    suffix = ".json"

    def document(self, report: Report[Any], exit_code: int, fail_on: Optional[FailOn]) -> str:
        from dflash_doctor.render.json_format import render_json

        return render_json(report, exit_code)

    @staticmethod
    def codes(document: str) -> List[str]:
        import json

        return [finding["code"] for finding in json.loads(document)["findings"]]


class SarifFormatter(DocumentFormatter):
    suffix = ".sarif"

    def document(self, report: Report[Any], exit_code: int, fail_on: Optional[FailOn]) -> str:
        from dflash_doctor.render.sarif import render_sarif

        return render_sarif(report, exit_code)

    @staticmethod
    def codes(document: str) -> List[str]:
        import json

        return [result["ruleId"] for run in json.loads(document)["runs"] for result in run["results"]]


class JunitFormatter(DocumentFormatter):
    suffix = ".xml"

    def document(self, report: Report[Any], exit_code: int, fail_on: Optional[FailOn]) -> str:
        from dflash_doctor.render.junit import render_junit

        # JUnit marks as failures exactly the findings at or above --fail-on; the others pass with details.
        return render_junit(report, exit_code, fail_on)

    @staticmethod
    def codes(document: str) -> List[str]:
        import xml.etree.ElementTree as ET

        # a finding's case is classname "dflash-doctor.<domain>.<code>"; clean parts and problems are not findings
        names = (case.get("classname", "").rsplit(".", 1)[-1] for case in ET.fromstring(document).iter("testcase"))
        return [name for name in names if _CODE.fullmatch(name)]


FORMATTERS: Dict[OutputFormat, Type[Formatter]] = {
    OutputFormat.TEXT: TextFormatter,
    OutputFormat.JSON: JsonFormatter,
    OutputFormat.SARIF: SarifFormatter,
    OutputFormat.JUNIT: JunitFormatter,
}
_UNMAPPED = [fmt.value for fmt in OutputFormat if fmt not in FORMATTERS]
if _UNMAPPED:
    raise TypeError(f"output formats without a formatter in FORMATTERS: {', '.join(_UNMAPPED)}")
