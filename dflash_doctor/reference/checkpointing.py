"""Drafter checkpoints: written atomically (temp file + rename), so a crash mid-save never leaves a torn file."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional

FILENAME = "drafter.pt"
FORMAT = 1


def checkpoint_path(folder: str) -> Path:
    return Path(folder) / FILENAME


def save_drafter(folder: str, state: dict, preset: str) -> str:
    """Write `state` ({"step", "drafter", "optimizer"}) to folder/drafter.pt atomically; returns the path."""
    import torch

    target = checkpoint_path(folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{FILENAME}.", dir=str(target.parent))
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save({"format": FORMAT, "preset": preset, **state}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return str(target)


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
