"""Drafter checkpoints: written atomically (temp file + rename), so a crash mid-save never leaves a torn file.

A temporary is named after the process writing it (`.drafter.pt.PID.XXXX.tmp`): one that a kill -9 left behind
is removed by the next start that saves there (`remove_stale_temporaries`), while a live run's is left alone.

What a file holds is a `DrafterCheckpoint`, written by `save_drafter` and read back, checked, by `load_drafter`
(the run that resumes is another process, maybe another release): a file of another format, preset or with a field
missing is one clear error, never a KeyError.
"""
from __future__ import annotations

import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO, Dict, List, Optional, cast

FILENAME = "drafter.pt"
FORMAT = 1
_TEMPORARY = re.compile(rf"\.{re.escape(FILENAME)}\.(?:(\d+)\.)?[^/]*$")  # ours (PID) or an older release's


@dataclass(frozen=True)
class DrafterCheckpoint:
    """A drafter as --save writes it and --resume reads it."""

    step: int  # the last step trained: a resumed run's numbering continues after it
    drafter: Dict[str, Any]  # the drafter's state_dict
    optimizer: Dict[str, Any]  # its AdamW's state_dict


def checkpoint_path(folder: str) -> Path:
    return Path(folder) / FILENAME


def save_drafter(folder: str, checkpoint: DrafterCheckpoint, preset: str) -> str:
    """Write `checkpoint` to folder/drafter.pt atomically, with this format and `preset`; returns the path."""
    import torch

    target = checkpoint_path(folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{FILENAME}.{os.getpid()}.", suffix=".tmp", dir=str(target.parent))
    try:
        with os.fdopen(fd, "wb") as handle:
            sink = _Sink(handle)
            try:
                state = {"format": FORMAT, "preset": preset, "step": checkpoint.step, "drafter": checkpoint.drafter,
                         "optimizer": checkpoint.optimizer}
                torch.save(state, cast(IO[bytes], sink))  # write, flush
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


def load_drafter(folder: str, preset: str) -> Optional[DrafterCheckpoint]:
    """The saved drafter for `preset`, or None when the folder has no checkpoint; ValueError if it is not ours or
    not whole."""
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
    missing = [key for key in ("step", "drafter", "optimizer") if key not in state]
    if missing:
        raise ValueError(f"{path} is not a whole drafter checkpoint: it has no {', '.join(missing)}")
    step, drafter, optimizer = state["step"], state["drafter"], state["optimizer"]
    if type(step) is not int or step < 0 or not isinstance(drafter, dict) or not isinstance(optimizer, dict):
        raise ValueError(f"{path} is not a whole drafter checkpoint: its step, drafter or optimizer is not what "
                         f"format {FORMAT} writes")
    return DrafterCheckpoint(step, drafter, optimizer)
