"""`dflash-doctor scan PATH...`: static detection of the hazards behind torch.compile thread races."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from dflash_doctor.commands.common import (
    EXIT_CODES_HELP,
    FORMAT_OPTION,
    OUTPUT_OPTION,
    check_output,
    finish,
    guarded,
)
from dflash_doctor.findings import FailOn, Report
from dflash_doctor.inputs import BASELINE, PYPROJECT, input_option
from dflash_doctor.render import OutputFormat
from dflash_doctor.render.help import epilog
from dflash_doctor.rules.scan import SCAN_RULES

EPILOG = epilog(
    ["dflash-doctor scan src/", "dflash-doctor scan train.py --format json",
     "dflash-doctor scan . --exclude 'tests/*' --select DFD1 --format sarif -o scan.sarif",
     "dflash-doctor scan . --ignore DFD202 --fail-on error",
     "dflash-doctor scan . --format json -o baseline.json",
     "dflash-doctor scan . --baseline baseline.json"],
    "The last two: record today's findings once, then report only new ones.",
    "Settings: [tool.dflash-doctor] in pyproject.toml (select, ignore, exclude, fail-on, per-file-ignores, "
    "entry-points), found from the scanned paths upward; options win over it.",
    "Silence one line with `# noqa: DFD102`; DFD302 reports noqa codes that silence nothing.",
    "Rules (`dflash-doctor explain CODE` for each): " + "; ".join(
        f"{code} {entry.rule.summary}" for code, entry in sorted(SCAN_RULES.items())) + ".",
    EXIT_CODES_HELP,
)


def _statistics_view(console, report: Report) -> None:
    """ruff-style --statistics: one line per code, most frequent first."""
    from rich.markup import escape

    counts: dict = {}
    for finding in report.findings:
        key = (finding.code, finding.name)
        counts[key] = counts.get(key, 0) + 1
    for (code, name), count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        console.print(f"{count:>6}  {code}  {escape(name)}")


def _verbose_view(console, facts: dict) -> None:
    """What the scan read and left out, before the findings (-v)."""
    from rich.markup import escape

    console.print(f"[dim]config: {escape(str(facts.get('config') or 'none'))}; {facts['files']} files, "
                  f"{facts['parsed']} parsed, {facts['loaded_for_call_chains']} loaded for call chains, "
                  f"{facts['jobs']} jobs, {facts['seconds']:.2f}s; rules {', '.join(facts['rules'])}[/]")
    for skipped in facts.get("skipped_folders", []):
        console.print(f"[dim]skipped {escape(skipped['path'])}: {escape(skipped['reason'])}[/]")
    hidden = facts.get("skipped_folders_total", 0) - len(facts.get("skipped_folders", []))
    if hidden > 0:
        console.print(f"[dim]... and {hidden} more skipped folders (JSON facts list the first ones)[/]")
    for followed in facts.get("followed_imports") or []:
        console.print(f"[dim]followed import: {escape(followed)}[/]")
    for entry in facts.get("entry_points") or []:
        console.print(f"[dim]entry point {escape(entry['path'])} ({escape(entry['how'])})[/]")
    for fix in facts.get("mitigations_applied", []):
        console.print(f"[dim]mitigation {escape(fix['mitigation'])} applied at {escape(fix['path'])}:{fix['line']}[/]")
    if facts.get("baseline"):
        base = facts["baseline"]
        console.print(f"[dim]baseline {escape(base['file'])}: {base['matched']} known, {base['new']} new, "
                      f"{base['fixed']} fixed[/]")


def _emit_text(report: Report, fail_on: FailOn, quiet: bool, statistics: bool, verbose: bool) -> int:
    """Text output with -q (findings and problems only, no summary line), -v and --statistics."""
    import io
    import sys

    from dflash_doctor.render import emit
    from dflash_doctor.render.text import console_for

    if statistics:
        _statistics_view(console_for(sys.stdout), report)
        shown = Report(report.command, findings=[], problems=report.problems, facts=report.facts)
        summary = io.StringIO()
        emit(shown, OutputFormat.TEXT, fail_on, out=io.StringIO(), err=summary)
        code = report.exit_code(fail_on)
        lines = summary.getvalue().splitlines()
        sys.stderr.write("".join(line + "\n" for line in lines[:-1]))
        if not quiet:
            total = len(report.findings)
            sys.stderr.write(f"scan: {total} finding{'s' if total != 1 else ''} (exit {code})\n")
        return code
    facts_view = (lambda console, facts: _verbose_view(console, facts)) if verbose else None
    if not quiet:
        return emit(report, OutputFormat.TEXT, fail_on, facts_view=facts_view)
    captured = io.StringIO()
    code = emit(report, OutputFormat.TEXT, fail_on, err=captured)
    sys.stderr.write("".join(line + "\n" for line in captured.getvalue().splitlines()[:-1]))  # all but summary
    return code


def register(app: typer.Typer) -> None:
    @app.command(epilog=EPILOG)
    @guarded
    def scan(
        paths: List[Path] = typer.Argument(..., metavar="PATH...", help="Files or folders to scan (folders: every .py file below)."),
        exclude: List[str] = typer.Option(
            [], "--exclude", "-x", help="Glob of files or folders to skip (repeatable), e.g. 'tests/*'.",
        ),
        select: Optional[str] = typer.Option(
            None, "--select", help="Only these rules: codes, prefixes or names, comma-separated (DFD1,DFD201).",
        ),
        ignore: Optional[str] = typer.Option(None, "--ignore", help="Skip these rules (same syntax as --select)."),
        jobs: Optional[int] = typer.Option(
            None, "--jobs", "-j", help="Worker processes for large trees (default: one per CPU core).",
        ),
        config: Optional[Path] = input_option(
            PYPROJECT, None, "--config",
            help="Read [tool.dflash-doctor] from this pyproject.toml instead of searching upward.",
            dir_okay=False,
        ),
        no_config: bool = typer.Option(False, "--no-config", help="Ignore every pyproject.toml."),
        baseline: Optional[Path] = input_option(
            BASELINE, None, "--baseline", dir_okay=False,
            help="An earlier `scan --format json` report: findings it holds are left out (matched by fingerprint, "
                 "robust to line moves).",
        ),
        statistics: bool = typer.Option(False, "--statistics", help="Count findings per rule instead of listing them."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="Findings and problems only, no summary line."),
        verbose: bool = typer.Option(
            False, "--verbose", "-v", help="Also say what was read and skipped, the config and the baseline."),
        fmt: OutputFormat = FORMAT_OPTION,
        fail_on: Optional[FailOn] = typer.Option(
            None, "--fail-on", case_sensitive=False,
            help="Lowest severity that makes the exit code 1 (default: fail-on from the config, else warning).",
        ),
        output: Optional[Path] = OUTPUT_OPTION,
    ) -> int:
        """Find gradient checkpointing that runs reentrant, compiled calls from threads, uncompiled
        flex_attention and a silenced nested-FX-trace error. Pure AST: never imports torch or your code."""
        check_output(output, paths, read_suffixes=(".py",))
        from dflash_doctor.errors import UsageError
        from dflash_doctor.scan import scan_paths
        from dflash_doctor.scan.config import resolve

        if quiet and verbose:
            raise UsageError("--quiet and --verbose contradict each other; pick one")
        names = [str(p) for p in paths]
        settings = resolve(names, str(config) if config else None, isolated=no_config)
        report = scan_paths(names, exclude=exclude, jobs=jobs, select=select, ignore=ignore, config=settings,
                            baseline=str(baseline) if baseline else None)
        threshold = FailOn(fail_on) if fail_on is not None else settings.fail_on or FailOn.WARNING
        if OutputFormat(fmt) is OutputFormat.TEXT and output is None and (quiet or verbose or statistics):
            return _emit_text(report, threshold, quiet, statistics, verbose)
        if statistics:
            report.facts["statistics"] = {code: n for code, n in report.facts["rule_counts"].items() if n}
        return finish(report, fmt, threshold, output)
