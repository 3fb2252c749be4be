"""Human output: findings like a linter (path:line:col CODE name message), facts views, problems on stderr."""
from __future__ import annotations

import os

import functools
from typing import TYPE_CHECKING, Any, Optional, TextIO, Type

from dflash_doctor.findings import Finding, Report, Severity
from dflash_doctor.printable import printable

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from dflash_doctor.render import F, FactsView

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


@functools.lru_cache(maxsize=None)
def _safe_console_class() -> Type[Console]:
    from rich.console import Console

    class SafeConsole(Console):
        """Every string this console draws (print, table cells, titles) goes through `printable` first, so a
        file name or a log line cannot move the cursor, clear the screen or hide text; line breaks stay, since
        views lay text out over several lines (data that must stay on one line is escaped where it is put)."""

        def render_str(self, text: str, **kwargs: Any) -> Text:
            return super().render_str(printable(text, keep_newlines=True), **kwargs)

        def on_broken_pipe(self) -> None:
            # rich's own handling exits 1 (the findings code here) and silences stdout even for a stderr
            # console: let the command's guard decide, as for any other write.
            import errno

            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    return SafeConsole


def console_for(stream: TextIO) -> Console:
    # No emoji codes: a file named `:fire:.py` is shown as it is named.
    return _safe_console_class()(file=stream, highlight=False, soft_wrap=True, emoji=False)


def render_text(report: Report[F], out: TextIO, err: TextIO, *, facts_view: Optional[FactsView[F]] = None,
                exit_code: int) -> None:
    from rich.markup import escape

    console = console_for(out)
    if facts_view is not None:
        facts_view(console, report.facts)
    for f in report.sorted_findings():
        where = f"{printable(f.path)}:{f.line}:{f.column}: " if f.path else ""
        if _render_as_list(console, f, where):
            continue
        console.print(
            f"{escape(where)}[{_STYLE[f.severity]}]{f.code}[/] [bold]{f.name}[/] {escape(printable(f.message))}"
        )
        chain = f.evidence.get("chain") if isinstance(f.evidence, dict) else None
        if chain:
            console.print(f"    [dim]via {escape(printable(' -> '.join(map(str, chain))))}[/]")
    render_problems_and_summary(report, err, exit_code)


def _render_as_list(console: Console, finding: Finding, where: str) -> bool:
    """A finding whose evidence carries its facts and fix as lists (`run` and `attach`, DFD9xx) is laid out one
    fact to a line at the console's width (render/live_view.py); any other keeps the one-line linter form."""
    evidence = finding.evidence if isinstance(finding.evidence, dict) else {}
    steps, details = evidence.get("next_steps"), evidence.get("details")
    if not isinstance(steps, list) or not isinstance(details, list):
        return False
    from rich.markup import escape

    from dflash_doctor.render.live_view import finding_lines

    head = f"{finding.code} {finding.name}"
    lines = finding_lines(head, where, finding.message, [str(d) for d in details], [str(s) for s in steps],
                          console.width)
    style = _STYLE[finding.severity]
    for line in lines:
        text = escape(line)
        if line.endswith(head):
            text = text.replace(finding.code, f"[{style}]{finding.code}[/]", 1)
        console.print(text)
    return True


def _styled(stream: TextIO) -> bool:
    """Whether rich would style this stream (a terminal, or colour forced): otherwise the same words are written
    plainly, without importing rich (a JSON or SARIF run into a file or a pipe starts ~30 ms sooner)."""
    isatty = getattr(stream, "isatty", None)
    return bool(os.environ.get("FORCE_COLOR") or os.environ.get("TTY_COMPATIBLE")) or bool(isatty and isatty())


def render_problems_and_summary(report: Report, err: TextIO, exit_code: int, summary: Optional[str] = None) -> None:
    counts = {s: sum(1 for f in report.findings if f.severity is s) for s in Severity}
    parts = [f"{n} {s.value}{'s' if n != 1 else ''}" for s, n in counts.items() if n]
    found = ", ".join(parts) if parts else "no findings"
    probs = f", {len(report.problems)} problem{'s' if len(report.problems) != 1 else ''}" if report.problems else ""
    closing = f"{report.command}: {summary or report.summary or found}{probs} (exit {exit_code})"
    if not _styled(err):
        for p in report.problems:
            hint = f" ({printable(p.hint)})" if p.hint else ""
            err.write(f"could not check {printable(p.subject)}: {printable(p.reason)}{hint}\n")
        err.write(closing + "\n")
        return
    from rich.markup import escape

    console = console_for(err)
    for p in report.problems:
        hint = f" [dim]({escape(printable(p.hint))})[/]" if p.hint else ""
        subject, reason = escape(printable(p.subject)), escape(printable(p.reason))
        console.print(f"[magenta]could not check[/] {subject}: {reason}{hint}")
    console.print(f"[dim]{escape(closing)}[/]")
