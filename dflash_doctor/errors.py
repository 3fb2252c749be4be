"""Domain errors. Only cli.py catches them, turning each into one line on stderr and an exit code."""
from __future__ import annotations

from typing import Optional

from dflash_doctor.findings import EXIT_PROBLEMS, EXIT_USAGE


class DoctorError(Exception):
    exit_code = EXIT_USAGE


class UsageError(DoctorError):
    """The user asked for something malformed or impossible (bad path, bad range, unknown code)."""

    exit_code = EXIT_USAGE


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is (cli.py installs the handler), so every `finally` and every
    Ctrl-C path runs for it too: children stopped, temporary folders removed, partial reports written."""


def stop_signal(exc: KeyboardInterrupt) -> str:
    """The signal a KeyboardInterrupt stands for: SIGTERM for Terminated, else SIGINT (Ctrl-C)."""
    return "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"


def finite(value: Optional[float], option: str, *, minimum: Optional[float] = None,
           maximum: Optional[float] = None, inclusive_minimum: bool = True) -> Optional[float]:
    """`value` if it is a finite number in range (None passes through), else a UsageError naming `option`.

    click's FloatRange lets NaN through (every comparison with NaN is false), and a NaN timeout disables the
    very watchdog it configures, so every float option goes through here (`guarded` checks finiteness for all
    of them; commands call it again with their ranges)."""
    import math

    if value is None:
        return None
    if not math.isfinite(value):
        raise UsageError(f"{option} must be a finite number, got {value}")
    low_ok = minimum is None or (value >= minimum if inclusive_minimum else value > minimum)
    if not low_ok or (maximum is not None and value > maximum):
        bound = (f" {'>=' if inclusive_minimum else '>'} {minimum:g}" if minimum is not None else "") + (
            f"{' and' if minimum is not None else ''} <= {maximum:g}" if maximum is not None else "")
        raise UsageError(f"{option} must be{bound}, got {value:g}")
    return value


class MissingDependency(DoctorError):
    """An optional heavy dependency (torch, NVML) is not importable; the message names the install command."""

    exit_code = EXIT_PROBLEMS


def require(module: str, *, package: str, install: str, purpose: str):
    """Import `module` or raise MissingDependency with one line naming the package and how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(
            f"{purpose} needs {package}, which is not importable here ({exc.__class__.__name__}: {exc}); "
            f"install it with: {install}"
        ) from exc


def require_torch(purpose: str):
    import warnings

    # torch without numpy (a bare CPU venv, like CI's) warns on import; nothing here uses numpy, so the warning
    # would only be noise at the top of every report.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    return require(
        "torch",
        package="torch",
        install="pip install torch  (dflash-doctor never installs or upgrades torch for you)",
        purpose=purpose,
    )
