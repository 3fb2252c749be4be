"""Which transformers releases checkpoint with the reentrant variant when the caller does not say (DFD104).

Read in the released wheels (`pip download --no-deps transformers==X`, `transformers/modeling_utils.py`,
`PreTrainedModel.gradient_checkpointing_enable`, and `Trainer`, which passes
`args.gradient_checkpointing_kwargs`, default None, straight to it):

| transformers | `gradient_checkpointing_kwargs=None` becomes | so the checkpoint runs |
|---|---|---|
| < 4.35.0 | (no such parameter: models call torch's checkpoint without use_reentrant) | reentrant (torch's default) |
| 4.35.0 - 4.37.x | `{}` | reentrant (torch's default) |
| 4.38.0 - 4.57.x | `{"use_reentrant": True}` | reentrant |
| >= 5.0.0 | `{"use_reentrant": False}` | non-reentrant |

Kwargs given without `use_reentrant` (`{"preserve_rng_state": True}`) are passed as they are on every release, so
torch's own default runs: reentrant (torch 2.13 warns and still runs the reentrant variant). Late 5.x releases add
`activation_checkpointing_enable(activation_checkpointing_kwargs=...)` with the same non-reentrant default.

The installed release is read from package metadata (importlib.metadata), never by importing transformers.
"""
from __future__ import annotations

import functools
import os
import re
import sys
from typing import Callable, Optional, Tuple

NON_REENTRANT_FROM = (5, 0, 0)
REENTRANT_RANGE = "transformers < 5.0 (every 4.x release)"
_VERSION = re.compile(r"^(\d+)(?:\.(\d+))?(?:\.(\d+))?")


def installed_transformers() -> Optional[str]:
    """The installed transformers release, from its metadata, or None."""
    return installed_release("transformers")


def installed_release(distribution: str) -> Optional[str]:
    """The installed release of `distribution` (transformers, trl, peft), from its metadata, or None.

    The version is read from the `NAME-X.Y.Z.dist-info` folder name on sys.path; importlib.metadata
    (which imports the email package, a tenth of a one-file scan's start-up) is asked only when a folder says
    nothing, as an egg or an editable install may. Read once per sys.path: checks ask for every file."""
    return _installed(distribution, tuple(sys.path))


@functools.lru_cache(maxsize=32)
def _installed(distribution: str, path: Tuple[str, ...]) -> Optional[str]:
    prefix = distribution + "-"
    for entry in path:
        try:
            names = os.listdir(entry) if entry else []
        except OSError:
            continue
        for name in names:
            if name.startswith(prefix) and name.endswith((".dist-info", ".egg-info")):
                version = name[len(prefix):].rsplit(".", 1)[0]
                if parse(version) is not None:
                    return version
                return _from_metadata(distribution)
    return None


def _from_metadata(distribution: str) -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except Exception:  # noqa: BLE001 - broken metadata means "not known", never a failed scan
        return None


def parse(version: Optional[str]) -> Optional[Tuple[int, int, int]]:
    match = _VERSION.match(version or "")
    if not match:
        return None
    major, minor, patch = (int(part or 0) for part in match.groups())
    return major, minor, patch


def default_is_reentrant(version: Optional[str]) -> Optional[bool]:
    """Whether `gradient_checkpointing_enable()` without kwargs checkpoints reentrant on `version` (None: unknown)."""
    parsed = parse(version)
    if parsed is None:
        return None
    return parsed < NON_REENTRANT_FROM


def implicit_default(version: Optional[str]) -> str:
    """The sentence DFD104 uses for "no use_reentrant reaches gradient_checkpointing_enable"."""
    reentrant = default_is_reentrant(version)
    ranges = ("transformers 4.38-4.57 pass use_reentrant=True, 4.35-4.37 and older leave torch's reentrant "
              "default, 5.0 and later default to use_reentrant=False")
    if reentrant is None:
        return f"checkpoints with the reentrant variant on {REENTRANT_RANGE} ({ranges}; no transformers installed here)"
    if reentrant:
        return f"checkpoints with the reentrant variant on transformers {version}, installed here ({ranges})"
    return (f"is non-reentrant on transformers {version}, installed here, but reentrant wherever the code runs "
            f"with {REENTRANT_RANGE} ({ranges})")


VersionSource = Callable[[], Optional[str]]
