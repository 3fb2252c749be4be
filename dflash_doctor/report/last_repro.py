"""Where the last repro result lives, so `report` can include it without re-running anything.

`repro` writes its JSON envelope (the same document `repro --format json` prints) to `last_repro_path()`;
`report` reads it back, or reads the file given with `--repro-json`. The cache folder follows XDG_CACHE_HOME
and can be moved with DFLASH_DOCTOR_CACHE.

A result says where, when and by which command it was made (`facts.made`, from `made_here`): a report that
bundles a result from some earlier run must say which run, and includes none that cannot say it.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import sys
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

LAST_REPRO_NAME = "last-repro.json"


def utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def made_here(started: _dt.datetime, finished: _dt.datetime, argv: Optional[Sequence[str]] = None,
              host: Callable[[], str] = socket.gethostname, cwd: Callable[[], str] = os.getcwd) -> dict:
    """Where, when and by which command a result was made: `facts.made` of a repro result."""
    from dflash_doctor.report.environment import command_line

    return {"command": command_line(sys.argv if argv is None else argv), "host": host(), "cwd": cwd(),
            "started_at": started.replace(microsecond=0).isoformat(),
            "finished_at": finished.replace(microsecond=0).isoformat()}


def made_when(document: dict) -> Optional[_dt.datetime]:
    """When a repro result was made (its `facts.made.finished_at`, timezone-aware), or None when it cannot say:
    then where and by which command are unknown too, and `report` leaves it out."""
    facts = document.get("facts")
    made = facts.get("made") if isinstance(facts, dict) else None
    if not isinstance(made, dict) or not all(isinstance(made.get(k), str) for k in ("command", "host", "cwd")):
        return None
    try:
        when = _dt.datetime.fromisoformat(str(made.get("finished_at")))
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def cache_dir(env: Optional[Mapping[str, str]] = None) -> Path:
    env = os.environ if env is None else env
    if env.get("DFLASH_DOCTOR_CACHE"):
        return Path(env["DFLASH_DOCTOR_CACHE"])
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dflash-doctor"


def last_repro_path(env: Optional[Mapping[str, str]] = None) -> Path:
    return cache_dir(env) / LAST_REPRO_NAME


def save_last_repro(envelope: dict, env: Optional[Mapping[str, str]] = None) -> Path:
    """Write `envelope` atomically (a concurrent `report` never reads half a file); returns the path."""
    from dflash_doctor.outputs import write_atomically

    path = last_repro_path(env)
    write_atomically(path, json.dumps(envelope, indent=2, default=str))
    return path


def remember_repro(report, exit_code: int, env: Optional[Mapping[str, str]] = None) -> Optional[Path]:
    """What `repro` calls after each run: save its JSON envelope for `report`. A cache that cannot be written
    (read-only home, full disk) must not fail the repro itself, so that is None instead of an error."""
    from dflash_doctor.render.json_format import envelope

    try:
        return save_last_repro(envelope(report, exit_code), env)
    except OSError:
        return None


class UnreadableRepro(Exception):
    """The repro file exists but is not a repro envelope; the message says why."""


class RefusedRepro(UnreadableRepro):
    """The path is not something a repro result can be read from at all: a FIFO, a device, a huge file."""


def load_repro(path: Path) -> Optional[dict]:
    """The envelope at `path`; None when there is no file; UnreadableRepro when it is not a repro envelope.

    Read through inputs.read_text (REPRO_JSON: a regular file of at most 16 MiB, opened without blocking), so a
    FIFO, a device or a huge file in its place is a RefusedRepro, never a hang or a full memory."""
    from dflash_doctor.errors import UsageError
    from dflash_doctor.inputs import REPRO_JSON, read_text

    if not os.path.lexists(path):
        return None
    try:
        text = read_text(os.fspath(path), REPRO_JSON, "")
    except UsageError as exc:
        raise RefusedRepro(str(exc).strip()) from exc
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise UnreadableRepro(f"{path} is not JSON ({exc.__class__.__name__}: {exc})") from exc
    if not isinstance(document, dict) or document.get("command") != "repro":
        raise UnreadableRepro(f"{path} is not a repro result (expected the JSON envelope of `dflash-doctor repro`)")
    return document
