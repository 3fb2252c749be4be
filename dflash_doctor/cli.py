"""The command line: a thin shell over the analysis packages. Parses options, calls one domain, renders.

Heavy modules (torch, pynvml) are never imported here: each command imports its domain lazily so that
`--help`, `scan` and `explain` start as fast as typer itself.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import List, Optional, Sequence

import typer
import typer.core

from dflash_doctor import TOOL_NAME, __version__, children
from dflash_doctor.commands import common
from dflash_doctor.render.help import HelpCommand, HelpGroup, epilog
from dflash_doctor.errors import UsageError
from dflash_doctor.findings import EXIT_USAGE

EPILOG = epilog(["dflash-doctor scan src/", "dflash-doctor guards", "dflash-doctor repro --threads 3",
                  "dflash-doctor explain DFD201"])

app = typer.Typer(
    name=TOOL_NAME,
    cls=HelpGroup,
    help="Diagnose PyTorch compile thread races (the FX-tracing error, the stuck flag, the compile-lock deadlock) "
         "in multi-threaded, multi-GPU training.",
    epilog=EPILOG,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    # Plain (click) help: rich help makes typer import typer.rich_utils -> rich.markdown, markdown_it, pygments,
    # which alone puts `--help` at ~1.9x a bare `import typer, rich.console` (issue 7's target is 1.5x).
    # benchmarks/results/run.md has the numbers. Help texts use no rich markup.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Each command lives in dflash_doctor/commands/<name>.py and registers itself.
COMMANDS = ("scan", "explain", "guards", "repro", "pipeline", "gpus", "logs", "status", "check", "report", "run",
            "attach")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"{TOOL_NAME} {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks instead of one-line errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    max_input_size: Optional[str] = typer.Option(
        None, "--max-input-size", metavar="SIZE",
        help="Raise the size cap of every file an option names (a baseline: 64MiB, a repro result: 16MiB, a "
             "pyproject.toml: 1MiB), e.g. --max-input-size 1GiB."),
) -> None:
    """Diagnose PyTorch compile thread races in multi-threaded, multi-GPU training."""
    common.DEBUG = debug
    if max_input_size is not None:
        from dflash_doctor import inputs

        try:
            inputs.LIMIT_OVERRIDE = inputs.parse_size(max_input_size)
        except UsageError as exc:
            common.error_line(str(exc))
            raise typer.Exit(exc.exit_code)


_registered: List[str] = []


def register_commands(names: Sequence[str] = COMMANDS) -> typer.Typer:
    """Register `names` (each once, in COMMANDS order) on the app and return it; the default is every command."""
    for name in COMMANDS:
        if name in names and name not in _registered:
            # By module name on purpose (not imports): a command line imports only the command it
            # names (commands_for), so `dflash-doctor scan` never loads the other commands' modules and the domains
            # they import at their top; importing them all here would put that cost on every start-up.
            importlib.import_module(f"dflash_doctor.commands.{name}").register(app)
            _registered.append(name)
    for info in app.registered_commands:  # every command's help laid out alike (render/help.py)
        if info.cls in (None, typer.core.TyperCommand):
            info.cls = HelpCommand
    return app


def commands_for(argv: Sequence[str]) -> Sequence[str]:
    """The commands a command line needs: the one it names, or all of them for the root's help, completion and
    anything click will answer with a usage error. The root's options take no values, so the first word that is
    not an option is the command. Importing only that command's module keeps its start-up short (a one-file scan
    is a target, benchmarks/results/run.md)."""
    if os.environ.get(f"_{TOOL_NAME.upper().replace('-', '_')}_COMPLETE"):
        return COMMANDS
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return (first,) if first in COMMANDS else COMMANDS


MIN_COLUMNS = 20  # below this (COLUMNS=0, a typo) rich would draw nothing at all: use the real terminal size


def _sane_terminal() -> None:
    """Whatever the environment says, the report is printed: an unusable COLUMNS/LINES is dropped, and a
    stream that cannot encode a character (PYTHONIOENCODING=ascii, a C locale) writes it as an escape."""
    import os

    for name, least in (("COLUMNS", MIN_COLUMNS), ("LINES", 1)):
        value = os.environ.get(name)
        if value is not None and not (value.strip().isdigit() and int(value) >= least):
            del os.environ[name]
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def _stop_on_signals() -> None:
    """SIGTERM ends a command as Ctrl-C does (its cleanup runs), with exit 143; a second one kills at once.
    Both first kill every registered child (children.stop_all): a thread of ours waiting on a probe or a
    phase would otherwise hold the command until that child's own timeout."""
    import signal

    def terminate(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        children.stop_all()
        raise common.Terminated()

    def interrupt(signum, frame):
        children.stop_all()
        raise KeyboardInterrupt()

    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, terminate)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, interrupt)


def _standard_streams() -> None:
    """A standard stream the process was started without (`>&-`, `<&-`, `2>&-`) is reopened on /dev/null, so
    no file opened later takes its number (a report would land in it) and nothing writes to None. A closed
    stdout is a usage error (exit 2): the report could go nowhere. A closed stdin makes `-` a usage error
    (inputs.preflight); a closed stderr only loses the error lines, the exit code still says what happened."""
    from dflash_doctor import inputs

    closed = inputs.closed_standard_streams()
    for fd in sorted(closed):
        devnull = os.open(os.devnull, os.O_RDWR)
        if devnull != fd:
            os.dup2(devnull, fd, inheritable=True)
            os.close(devnull)
        else:
            os.set_inheritable(fd, True)
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        if fd in closed or getattr(sys, name) is None:
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", encoding="utf-8", closefd=False))
    inputs.STDIN_CLOSED = 0 in closed
    if 1 in closed:
        common.error_line("standard output is closed (>&-): the report could go nowhere; redirect it to a file "
                          "or /dev/null instead")
        sys.exit(EXIT_USAGE)


def main() -> None:
    children.drop_working_folder_from_path()  # again for the console script, which skips __main__.py
    children.isolate_process()
    _standard_streams()
    _sane_terminal()
    _stop_on_signals()
    # Not standalone: click's own usage errors come back here as exceptions, to be shown as one line like every
    # other error instead of click's usage block. Typer vendors click in some releases, so match by attributes.
    register_commands(commands_for(sys.argv[1:]))
    try:
        code = app(prog_name=TOOL_NAME, standalone_mode=False)
        children.stop_all()
        sys.stdout.flush()
    except BrokenPipeError:  # the final flush, after the command (inside one, `guarded` handles it)
        common.quiet_exit_on_broken_pipe(common.streams_without_reader() or [sys.stdout.fileno()])
    except SystemExit as exc:
        # click ends a broken pipe outside any command (`--help | head -1`) with exit 1, which reads as
        # "findings" here: give it the same code as inside a command.
        gone = common.streams_without_reader() if exc.code == 1 else []
        if gone:
            common.quiet_exit_on_broken_pipe(gone)
        raise
    except KeyboardInterrupt as exc:  # outside a command (while parsing, while importing one)
        terminated = isinstance(exc, common.Terminated)
        common.error_line("terminated" if terminated else "interrupted")
        sys.exit(common.EXIT_TERMINATED if terminated else common.EXIT_INTERRUPTED)
    except Exception as exc:  # noqa: BLE001 - click's exceptions are usage errors; anything else is internal
        if not (hasattr(exc, "format_message") and hasattr(exc, "exit_code")):
            if common.DEBUG or "--debug" in sys.argv[1:2]:
                import traceback

                traceback.print_exc()
            common.error_line(f"internal error: {exc.__class__.__name__}: {exc} (rerun with --debug for the "
                              "traceback)")
            sys.exit(common.EXIT_INTERNAL)
        # a bare `dflash-doctor` or group: the help, as click does
        if type(exc).__name__ == "NoArgsIsHelpError" and hasattr(exc, "show"):
            exc.show()
        else:
            context = getattr(exc, "ctx", None)
            hint = f" (see '{context.command_path} --help')" if context is not None else ""
            common.error_line(f"{exc.format_message()}{hint}")
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
