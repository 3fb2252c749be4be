"""Where the last repro result lives, so `report` can include it without re-running anything.

`repro` writes its JSON envelope (the same document `repro --format json` prints) to `last_repro_path()`;
`report` reads it back, or reads the file given with `--repro-json`. The cache folder follows XDG_CACHE_HOME
and can be moved with DFLASH_DOCTOR_CACHE.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Optional

LAST_REPRO_NAME = "last-repro.json"


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
    import tempfile

    path = last_repro_path(env)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(envelope, handle, indent=2, default=str)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
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


def load_repro(path: Path) -> Optional[dict]:
    """The envelope at `path`; None when there is no file; UnreadableRepro when it is not a repro envelope."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise UnreadableRepro(f"cannot read {path}: {exc.__class__.__name__}: {exc}") from exc
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UnreadableRepro(f"{path} is not JSON ({exc})") from exc
    if not isinstance(document, dict) or document.get("command") != "repro":
        raise UnreadableRepro(f"{path} is not a repro result (expected the JSON envelope of `dflash-doctor repro`)")
    return document
