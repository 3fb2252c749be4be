"""Drafter checkpoints: written atomically (temp file + rename), so a crash mid-save never leaves a torn file.

A temporary is named after the process writing it (`.drafter.pt.PID.XXXX.tmp`): one that a kill -9 left behind
is removed by the next start that saves there (`remove_stale_temporaries`), while a live run's is left alone.
"""
from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path
from typing import IO, BinaryIO, List, Optional, cast

FILENAME = "drafter.pt"
FORMAT = 1
_TEMPORARY = re.compile(rf"\.{re.escape(FILENAME)}\.(?:(\d+)\.)?[^/]*$")  # ours (PID) or an older release's


def checkpoint_path(folder: str) -> Path:
    return Path(folder) / FILENAME


def save_drafter(folder: str, state: dict, preset: str) -> str:
    """Write `state` ({"step", "drafter", "optimizer"}) to folder/drafter.pt atomically; returns the path."""
    import torch

    target = checkpoint_path(folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{FILENAME}.{os.getpid()}.", suffix=".tmp", dir=str(target.parent))
    try:
        with os.fdopen(fd, "wb") as handle:
            sink = _Sink(handle)
            try:
                torch.save({"format": FORMAT, "preset": preset, **state}, cast(IO[bytes], sink))  # write, flush
            except RuntimeError as exc:
                if sink.error is not None:
                    raise sink.error from exc
                raise
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return str(target)


class _Sink:
    """The file torch.save writes through, keeping the OSError a write raised: torch turns it into a
    RuntimeError ("unexpected pos 39232 vs 39184") that no longer says the disk was full."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.error: Optional[OSError] = None

    def write(self, data: bytes) -> int:
        try:
            return self.handle.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.handle.flush()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def remove_stale_temporaries(folder: str) -> List[str]:
    """Delete the temporaries of saves that never finished (their process is gone); returns what was removed."""
    removed: List[str] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        match = _TEMPORARY.match(name)
        if match is None or (match.group(1) and _alive(int(match.group(1)))):
            continue
        path = os.path.join(folder, name)
        try:
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.unlink(path)
                removed.append(path)
        except OSError:
            continue
    return removed


def load_drafter(folder: str, preset: str) -> Optional[dict]:
    """The saved state for `preset`, or None when the folder has no checkpoint; ValueError if it is not ours."""
    import torch

    path = checkpoint_path(folder)
    if not path.is_file():
        return None
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user-facing problem
        raise ValueError(f"{path} is not a readable drafter checkpoint ({exc.__class__.__name__}: {exc})") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a dflash-doctor drafter checkpoint (format {FORMAT})")
    if state.get("preset") != preset:
        raise ValueError(f"{path} was saved by preset {state.get('preset')!r}, not {preset!r}")
    return state
