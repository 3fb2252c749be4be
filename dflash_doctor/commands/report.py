"""`dflash-doctor report [--out FILE.md|.html]`: one shareable, redacted file for an issue tracker."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from dflash_doctor.commands.common import check_output, error_line, guarded, write_document
from dflash_doctor.errors import UsageError
from dflash_doctor.render.help import epilog
from dflash_doctor.inputs import REPRO_JSON, input_option

SUFFIXES = {".md": "markdown", ".markdown": "markdown", ".html": "html", ".htm": "html"}
EPILOG = epilog(
    ["dflash-doctor report > report.md", "dflash-doctor report --out report.html",
     "dflash-doctor report src/ --no-probes --out report.md", "dflash-doctor report --repro-json repro.json"],
    "The last repro result is read from ~/.cache/dflash-doctor/last-repro.json (XDG_CACHE_HOME, or "
    "DFLASH_DOCTOR_CACHE, moves it) unless --repro-json names a file.  Exit codes: 0 written (sections that "
    "could not be collected say so inside); 2 usage error; 3 internal error; 4 --out could not be written after "
    "all (the report went to a temporary file, named on stderr)."
)


def register(app: typer.Typer) -> None:
    @app.command(epilog=EPILOG)
    @guarded
    def report(
        paths: Optional[List[Path]] = typer.Argument(
            None, help="Files or folders to summarise the scan of (default: the current folder).", show_default=False
        ),
        out: Optional[Path] = typer.Option(
            None, "--out", help="Write to FILE.md or FILE.html (default: Markdown on stdout).", dir_okay=False
        ),
        repro_json: Optional[Path] = input_option(
            REPRO_JSON, None, "--repro-json",
            help="A repro result (`repro --format json` output) to include instead of the last one.",
            dir_okay=False,
        ),
        probes: bool = typer.Option(True, "--probes/--no-probes", help="Run the guards' live probes (needs torch)."),
        timeout: float = typer.Option(120.0, "--timeout", help="Seconds allowed to the guards' probes (>= 1)."),
    ) -> int:
        """Write a bug report: environment, guards verdict, scan summary, GPU snapshot and last repro, redacted."""
        from dflash_doctor.commands.common import finite

        finite(timeout, "--timeout", minimum=1.0)
        kind = "markdown"
        if out is not None:
            kind = SUFFIXES.get(out.suffix.lower(), "")
            if not kind:
                raise UsageError(f"--out {out}: use a .md or .html file name")
        check_output(out, [*(paths or ()), repro_json], "--out")
        from dflash_doctor.report import build_bundle, render_html, render_markdown

        bundle = build_bundle(
            tuple(str(p) for p in paths) if paths else (".",), probes=probes, timeout=timeout, repro_json=repro_json
        )
        text = render_html(bundle) if kind == "html" else render_markdown(bundle)
        if out is None:
            sys.stdout.write(text)
            return 0
        code, where = write_document(out, text, "--out", "report", out.suffix.lower())
        if code:
            error_line(where)
        else:
            from dflash_doctor.printable import printable

            sys.stderr.write(f"dflash-doctor: wrote {printable(where)} ({len(bundle.problems)} section(s) could not "
                             "be collected)\n")
        return code
