"""`dflash-doctor run -- COMMAND`: run the user's own command, unmodified, with the flight recorder and the
watchdog in every Python process it starts; report the races it saw."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional, Tuple

import typer

from dflash_doctor import mitigations as registry
from dflash_doctor.commands.common import FORMAT_OPTION, OUTPUT_OPTION, check_output, finish, guarded, write_artifact
from dflash_doctor.errors import UsageError, finite
from dflash_doctor.render import OutputFormat
from dflash_doctor.vocabularies import Amplifier, Cache, OnHang, RunExpect

# Each example on a line of its own: click keeps a paragraph that starts with \b as written.
EPILOG = (
    "Contract: the command runs as you would run it (same argv, working folder, stdin, stdout, environment "
    "plus PYTHONPATH and two DFLASH_DOCTOR_RUN_* entries); every Python process it starts loads the recorder "
    "and watchdog first. The report goes to stderr or --output, never to stdout, which stays the command's. "
    "Exit code: the command's own (a death by signal N is 128+N, Ctrl-C 130, SIGTERM 143); with --fix, the fix "
    "arm's (the baseline is expected to fail); with --expect clean a finding (of the fix arm) turns 0 into 1; "
    "2 usage error (a --fix that needs your code is refused, with how to apply it). "
    "126/127 when the command cannot be executed, as a shell. Ctrl-C and Ctrl-Z at the terminal reach the command "
    "as without the tool; SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1/2 and SIGALRM sent to run are forwarded to the "
    "command's process group; every process the command started that is still running when it ends (other "
    "sessions and groups included) is ended and named, and after a SIGKILL to run a watcher ends them.\n\n"
    "\b\nExamples:\n"
    "  dflash-doctor run -- python train.py --steps 100\n"
    "  dflash-doctor run --cache cold -f json -o run.json -- torchrun --nproc-per-node 2 train.py\n"
    "  dflash-doctor run --fix threadlocal-flag,non-lazy-backward --cache cold -- python train.py\n"
    "  dflash-doctor run --fix isolate-fx-patches --trials 4 --amplify switch-interval -- python train.py\n"
    "  dflash-doctor run --expect clean --trials 3 --on-hang kill -- python -m mypkg.train\n"
    "  dflash-doctor run --trace trace.json -- python train.py"
)


def fix_names(text: Optional[str]) -> Tuple[str, ...]:
    """Registry names that `run` can apply to an unmodified command; any other is refused with its api text."""
    if text is None:
        return ()
    names = registry.parse(text)
    for name in names:
        entry = registry.get(name)
        if not entry.applies_without_code_change:
            raise UsageError(f"--fix {name} needs a change in your own code, which run does not make: {entry.api}")
    return names


PROOF_PAIRS = 3  # --fix with its baseline and no --trials: three of each arm


def amplifier_names(text: Optional[str]) -> Tuple[str, ...]:
    """`switch-interval,foreign-trace` -> their vocabularies.Amplifier values, in the vocabulary's order."""
    if text is None:
        return ()
    names = {part.strip().lower() for part in text.split(",") if part.strip()}
    known = [a.value for a in Amplifier]
    unknown = sorted(names - set(known))
    if unknown or not names:
        raise UsageError(f"unknown amplifier {', '.join(unknown) or repr(text)}; choose from {', '.join(known)} "
                         "(combine with commas; --cache cold is the third)")
    return tuple(name for name in known if name in names)


def _announcer(on_hang: OnHang):
    """Each finding as a record shows it, while the command runs; for a hang, what happens next."""
    from dflash_doctor.printable import printable

    def announce(finding, is_hang: bool) -> None:
        lines = [f"dflash-doctor: {finding.code} {finding.name}: {printable(finding.message)}"]
        if is_hang and on_hang is OnHang.KILL:
            lines.append("dflash-doctor: killing the command's process tree (--on-hang kill)")
        elif is_hang:
            lines.append(f"dflash-doctor: the run is kept alive (--on-hang report); stop it with Ctrl-C, or kill "
                         f"-TERM {os.getpid()} (forwarded to the command's processes)")
        _say_lines(lines)

    return announce


def _say_lines(lines: List[str]) -> None:
    sys.stderr.write("".join(f"{line}\n" for line in lines))
    sys.stderr.flush()


def _progress(result, total: int) -> None:
    found = f"{len(result.findings)} finding(s)" if result.findings else "no findings"
    _say_lines([f"dflash-doctor: trial {result.index + 1}/{total}: exit {result.exit_code}, {found} "
                f"({result.seconds:.1f} s)"])


def _command_inputs(command: List[str]) -> List[str]:
    """The files the command names that exist (its script, its config, the program itself): -o must not be
    one of them (`run -o train.py -- python train.py` would replace the user's script with the report)."""
    import shutil

    found = [arg for arg in command if os.path.isfile(arg)]
    program = shutil.which(command[0]) if command else None
    return found + ([program] if program else [])


def _per_rank_path(path: Path, rank: int) -> Path:
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def register(app: typer.Typer) -> None:
    @app.command(epilog=EPILOG, context_settings={"allow_interspersed_args": False})
    @guarded
    def run(
        command: Optional[List[str]] = typer.Argument(None, metavar="-- COMMAND [ARGS]...",
                                                      help="Your command, exactly as you run it."),
        hang_after: float = typer.Option(
            120.0, "--hang-after", help="Seconds with no compile event and no CPU use, after a compile began, before "
            "a hang without a lock cycle is reported (a lock cycle is named within seconds, without waiting)."),
        on_hang: OnHang = typer.Option(OnHang.REPORT, "--on-hang", case_sensitive=False,
                                       help="report: say it on stderr at once and keep the run alive; kill: kill "
                                            "the command's process tree, then report."),
        fix: Optional[str] = typer.Option(
            None, "--fix", help="Prove registry fixes in your unmodified run: each trial runs twice, once without "
            "the fix (the baseline) and once with it, alternating, and each race reads holds (the baseline showed "
            "it, the fix stopped it), fails (it showed with the fix) or inconclusive (the baseline never showed "
            "it: try more --trials, --amplify, --cache cold). Fixes with a process-wide set-up or a per-thread "
            "switch (" + ", ".join(m.name for m in registry.REGISTRY if m.applies_without_code_change)
            + "); combine with commas."),
        baseline: bool = typer.Option(
            True, "--baseline/--no-baseline", help="With --fix: run the same command without the fix beside it "
            "(default). --no-baseline runs only the fix: no verdict, the findings alone."),
        amplify: Optional[str] = typer.Option(
            None, "--amplify", help="Make a rare race likely without changing what your code computes, in every "
            "Python process: switch-interval (sys.setswitchinterval(0.0002) before your first thread), foreign-trace (a "
            "thread of the tool's own loops torch.fx.symbolic_trace beside your threads: a race it shows is one "
            "your run has IF a thread traces with FX); combine with commas. --cache cold is the third."),
        cache: Cache = typer.Option(Cache.WARM, "--cache", case_sensitive=False,
                                    help="cold: a fresh TORCHINDUCTOR_CACHE_DIR for each trial (nothing compiled "
                                         "before, the incident's trigger); warm: yours, as it is."),
        trials: Optional[int] = typer.Option(
            None, "--trials", min=1, max=100, help="Run the command K times; the report gives the rate. Default 1; "
            "with --fix and its baseline, 3 pairs (each pair: one trial without the fix, one with it)."),
        expect: Optional[RunExpect] = typer.Option(None, "--expect", case_sensitive=False,
                                                   help="clean: a finding fails the run (exit 1 if the command "
                                                        "exited 0)."),
        keep: bool = typer.Option(False, "--keep", help="Keep the session folder (per-process records) and say "
                                                        "where it is."),
        leave_running: bool = typer.Option(False, "--leave-running",
                                           help="Processes the command leaves running when it ends (a daemon, a "
                                                "server it started) are named, not ended."),
        trace: Optional[Path] = typer.Option(None, "--trace", dir_okay=False,
                                             help="Write a Perfetto (Chrome trace) timeline; under torchrun also "
                                                  "one per rank (NAME.rankN.json)."),
        fmt: OutputFormat = FORMAT_OPTION,
        output: Optional[Path] = OUTPUT_OPTION,
    ) -> int:
        """Run COMMAND unmodified with the flight recorder and watchdog in each of its Python processes; name the
        thread that held the FX flag when one raised, the compile_lock / autograd deadlock as it forms, and
        prove a fix with --fix."""
        finite(hang_after, "--hang-after", minimum=1.0)
        fixes = fix_names(fix)
        amplifiers = amplifier_names(amplify)
        proving = bool(fixes) and baseline
        if not baseline and not fixes:
            raise UsageError("--no-baseline applies to --fix (without a fix there is no baseline to leave out)")
        trials = trials or (PROOF_PAIRS if proving else 1)
        command = list(command or [])
        if command and command[0] == "--":
            command = command[1:]
        # the outputs first, as every command checks them before any work (an empty command names no input)
        check_output(output, _command_inputs(command))
        check_output(trace, [output, *_command_inputs(command)], "--trace")
        if not command:
            raise UsageError("no command given: dflash-doctor run [OPTIONS] -- COMMAND [ARGS]...")
        from dflash_doctor.supervise.supervisor import (
            RunSpec, Supervisor, ranks_of, report_for, trace_phases,
        )

        spec = RunSpec(tuple(command), hang_after_s=hang_after, on_hang=on_hang, fixes=fixes,
                       cold_cache=cache is Cache.COLD, trials=trials, keep=keep, leave_running=leave_running,
                       amplifiers=amplifiers)

        def supervisor(arm: RunSpec) -> Supervisor:
            return Supervisor(arm, _announcer(on_hang), say=lambda line: _say_lines([f"dflash-doctor: {line}"]),
                              progress=_progress)

        if proving:  # the baseline arm's trials leave the exit code and --expect to the fix arm's
            from dflash_doctor.supervise.proof import add_proof, run_pairs

            baseline_results, results = run_pairs(spec, supervisor)
            report = report_for(spec, results, expect_clean=expect is RunExpect.CLEAN)
            add_proof(report, baseline_results, results, spec)
            results = baseline_results + results  # for --trace and --keep: every trial
        else:
            from dflash_doctor.supervise.proof import run_advice

            results = supervisor(spec).run()
            report = report_for(spec, results, expect_clean=expect is RunExpect.CLEAN)
            report.facts["advice"] = run_advice(results, fixes)
        code = report.exit_code_override if report.exit_code_override is not None else 0
        if trace is not None:
            from dflash_doctor.runtime.chrome_trace import write_chrome_trace

            write_artifact(report, "--trace", trace, lambda path: write_chrome_trace(path, trace_phases(results)))
            for rank in ranks_of(results):
                def write_rank(path: Path, rank: int = rank) -> None:
                    write_chrome_trace(path, trace_phases(results, rank))

                write_artifact(report, "--trace", _per_rank_path(trace, rank), write_rank)
        try:
            for result in results:
                if result.session:
                    sys.stderr.write(f"dflash-doctor: session kept in {result.session}\n")
            _finish(report, fmt, output)
        except OSError:  # stderr went away: the report is lost, the command's exit code is not
            _silence_stderr()
        return code  # the command's, whatever happened to the report (finish's own code is not it)


def _finish(report, fmt: OutputFormat, output: Optional[Path]) -> None:
    """The report to --output (a fallback file named on stderr if that fails), or to stderr. A machine format
    on stderr is written last, on one line of its own, after the tool's other lines, so the last line of stderr
    is the document whatever the command wrote before it."""
    import io
    import json

    from dflash_doctor.render.live_view import render_run_facts

    if output is not None or fmt not in (OutputFormat.JSON, OutputFormat.SARIF):
        finish(report, fmt, output=output, facts_view=render_run_facts, report_stream=sys.stderr)
        return
    document = io.StringIO()
    finish(report, fmt, facts_view=render_run_facts, report_stream=document)
    sys.stderr.write("\n" + json.dumps(json.loads(document.getvalue()), separators=(",", ":")) + "\n")
    sys.stderr.flush()


def _silence_stderr() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
    except OSError:
        pass
