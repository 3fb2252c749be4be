"""One formatter per output format (pip-audit's `_format/` shape): each writes a report to `out` and its
problems and summary line to `err`. `render.formatter_for` picks one; `suffix` names a file of that format."""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, ClassVar, Optional, TextIO

from dflash_doctor.findings import FailOn, Report

if TYPE_CHECKING:
    from dflash_doctor.render import FactsView


class Formatter(abc.ABC):
    suffix: ClassVar[str]

    @abc.abstractmethod
    def write(self, report: Report[Any], out: TextIO, err: TextIO, *, exit_code: int, fail_on: FailOn,
              facts_view: Optional[FactsView[Any]] = None) -> None:
        """Write the report to `out`, problems and the summary line to `err`."""


class TextFormatter(Formatter):
    suffix = ".txt"

    def write(self, report: Report[Any], out: TextIO, err: TextIO, *, exit_code: int, fail_on: FailOn,
              facts_view: Optional[FactsView[Any]] = None) -> None:
        from dflash_doctor.render.text import render_text

        render_text(report, out, err, facts_view=facts_view, exit_code=exit_code)


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


class SarifFormatter(DocumentFormatter):
    suffix = ".sarif"

    def document(self, report: Report[Any], exit_code: int, fail_on: Optional[FailOn]) -> str:
        from dflash_doctor.render.sarif import render_sarif

        return render_sarif(report, exit_code)


class JunitFormatter(DocumentFormatter):
    suffix = ".xml"

    def document(self, report: Report[Any], exit_code: int, fail_on: Optional[FailOn]) -> str:
        from dflash_doctor.render.junit import render_junit

        # JUnit marks as failures exactly the findings at or above --fail-on; the others pass with details.
        return render_junit(report, exit_code, fail_on)
