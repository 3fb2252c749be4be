"""Running the real CLI against hostile input, bounded in time and memory, and reading what the typer app
declares (commands, float options, --output) so a new command or option is attacked without editing the suite.
"""
from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import time
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from tests.conftest import REPO

# Enough address space for any command that does not import torch; a read of /dev/zero hits it in seconds
# instead of taking the machine's memory.
MEMORY_LIMIT = 2 * 2**30


@dataclass
class Run:
    argv: List[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def __str__(self) -> str:
        return (f"{' '.join(self.argv)} -> exit {self.returncode} in {self.seconds:.1f}s\n"
                f"stdout: {self.stdout[-1500:]}\nstderr: {self.stderr[-1500:]}")


def cli_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    # No empty entry: it would mean "the working folder" to every child, which is what is being tested.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.setdefault("COLUMNS", "200")
    env.update(extra or {})
    return env


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant, including those in sessions of their own."""
    import psutil

    try:
        root = psutil.Process(pid)
        family = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for process in family:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=5)


def run(*args, cwd=None, env=None, timeout: float = 20, stdin=None, limit_memory: bool = True,
        binary_stdout: bool = False) -> Run:
    """`python -m dflash_doctor ARGS`; fails the test (AssertionError) if it is still running after `timeout`,
    after killing it and everything it started."""
    argv = [sys.executable, "-m", "dflash_doctor", *map(str, args)]
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd or REPO, env=cli_env(env), stdin=subprocess.PIPE if stdin else
                            subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_limit_memory if limit_memory else None, start_new_session=True)
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()
        raise AssertionError(f"hung: {' '.join(map(str, args))} still running after {timeout:g}s\n"
                             f"stderr: {err[-1500:].decode(errors='replace')}")
    decode = (lambda b: b.decode("latin-1")) if binary_stdout else (lambda b: b.decode("utf-8", "replace"))
    return Run([str(a) for a in args], proc.returncode, decode(out), err.decode("utf-8", "replace"),
               time.monotonic() - started)


def assert_one_error_line(result: Run, code: int, *mentions: str) -> None:
    """The documented failure: exit `code`, exactly one `dflash-doctor: error:` line, no traceback."""
    assert result.returncode == code, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dflash-doctor: error: "), result
    assert "Traceback" not in result.stderr, result
    for text in mentions:
        assert text in lines[0], result


def assert_no_crash(result: Run) -> None:
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result
    assert result.returncode not in (3, 134, 139) and result.returncode >= 0, result


# --- what the app declares -------------------------------------------------------------------------------------
def commands() -> Dict[str, object]:
    """{command name: its callback} for every registered command."""
    from dflash_doctor.cli import register_commands

    app = register_commands()

    return {(info.name or info.callback.__name__).replace("_", "-"): info.callback for info in app.registered_commands}


def _option_name(parameter: inspect.Parameter) -> str:
    declared = [d for d in getattr(parameter.default, "param_decls", ()) or () if d.startswith("--")]
    return declared[0] if declared else "--" + parameter.name.replace("_", "-")


def float_options() -> List[Tuple[str, str]]:
    """(command, --option) for every float option of every command."""
    found = []
    for name, callback in commands().items():
        hints = typing.get_type_hints(callback)
        for parameter in inspect.signature(callback).parameters.values():
            if hints.get(parameter.name) in (float, Optional[float]):
                found.append((name, _option_name(parameter)))
    return found


def output_options() -> List[Tuple[str, str]]:
    """(command, --option) for every option that names a file the command writes."""
    from dflash_doctor.commands.common import OUTPUT_OPTION

    found = []
    for name, callback in commands().items():
        for parameter in inspect.signature(callback).parameters.values():
            option = _option_name(parameter)
            if parameter.default is OUTPUT_OPTION or option in WRITTEN_FILE_OPTIONS:
                found.append((name, option))
    return found


# Options besides --output that name a file the command writes.
WRITTEN_FILE_OPTIONS = ("--out", "--trace")


def required_args(command: str, folder: Path) -> List[str]:
    """The least a command needs to start, with harmless inputs in `folder`, and nothing slow."""
    log = folder / "run.log"
    if not log.exists():
        log.write_text("drafter-0 step=1 loss=2.0 tok/s=100\n", encoding="utf-8")
    source = folder / "train.py"
    if not source.exists():
        source.write_text("x = 1\n", encoding="utf-8")
    table = {
        "scan": [str(source)],
        "explain": ["DFD101"],
        "guards": ["--no-probes"],
        "repro": ["--device", "cpu"],
        "pipeline": ["--device", "cpu"],
        "gpus": [],
        "logs": [str(log)],
        "status": ["--log", str(log)],
        "check": [str(source), "--no-probes"],
        "report": [str(source), "--no-probes"],
        "run": [],  # its options go before `-- COMMAND`: with no command it stops at the first bad option
        "attach": [str(os.getpid())],
    }
    assert set(table) == set(commands()), "a new command: tell required_args how to start it"
    return table[command]


def descendants_with_real_torch(pid: int) -> List[int]:
    """Processes below `pid` that have loaded the installed torch's C library (a planted torch.py has none)."""
    import psutil

    torch_lib = _installed_torch_lib()
    found = []
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return found
    for child in children:
        try:
            maps = Path(f"/proc/{child.pid}/maps").read_text()
        except OSError:
            continue
        if torch_lib in maps:
            found.append(child.pid)
    return found


def _installed_torch_lib() -> str:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin, "these tests need torch installed"
    return str(Path(spec.origin).parent / "lib")


PLANTED_MODULE = """\
import os
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "PLANTED_RAN"), "a") as marker:
    marker.write(f"{os.getpid()} imported {__name__}\\n")
raise ImportError("the planted module from the working folder was imported")
"""


def plant(folder: Path, names: Sequence[str] = ("torch", "numpy", "typer", "rich", "psutil")) -> Path:
    """Modules in `folder` that record being imported (and then fail); returns the marker they write."""
    for name in names:
        (folder / f"{name}.py").write_text(PLANTED_MODULE, encoding="utf-8")
    return folder / "PLANTED_RAN"


def run_until_a_child_has_torch(args: Sequence[str], cwd: Path, timeout: float) -> Tuple[Optional[int], bool]:
    """Start the command in `cwd`; stop it as soon as one of its children has loaded the real torch (the
    question is answered: that child did not import the planted one), or when it exits. Returns (exit code or
    None when stopped early, whether a child with the real torch was seen)."""
    argv = [sys.executable, "-m", "dflash_doctor", *map(str, args)]
    proc = subprocess.Popen(argv, cwd=cwd, env=cli_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if descendants_with_real_torch(proc.pid):
                return None, True
            if proc.poll() is not None:
                return proc.returncode, False
            if (cwd / "PLANTED_RAN").exists():
                return None, False
            time.sleep(0.05)
        raise AssertionError(f"{' '.join(map(str, args))} neither finished nor started torch in {timeout:g}s")
    finally:
        kill_tree(proc.pid)
        proc.wait()


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def send(proc: subprocess.Popen, signum: int = signal.SIGTERM) -> None:
    os.kill(proc.pid, signum)
