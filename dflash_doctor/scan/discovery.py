"""Which files a scan reads: the paths given, walked for `.py` files, minus excludes and other people's code.

Every folder the walk leaves out is recorded with its reason, and a folder it cannot list is a Problem: a scan
never narrows itself silently.
"""
from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, List, Sequence, Tuple

from dflash_doctor.errors import UsageError
from dflash_doctor.scan.config import matches, relative_to
from dflash_doctor.findings import Problem

if TYPE_CHECKING:
    from dflash_doctor.scan.facts import SkippedFolderFacts

DEFAULT_EXTENSIONS = (".py",)
# Never the user's own code: version control, tool caches and installed-package stores, whatever they contain.
SKIPPED_DIR_NAMES = {
    ".git": "version control", ".hg": "version control", ".svn": "version control",
    "__pycache__": "bytecode cache", ".mypy_cache": "tool cache", ".pytest_cache": "tool cache",
    ".ruff_cache": "tool cache", ".tox": "tox environments", ".nox": "nox environments",
    "node_modules": "JavaScript packages", ".eggs": "setuptools eggs",
    # Installed packages are skipped while walking, but scanned when the user points at them (or inside them).
    "site-packages": "installed packages", "dist-packages": "installed packages",
}
# A folder is a Python environment when it says so, whatever its name: `env/` full of sources is scanned.
ENVIRONMENT_MARKERS = (("pyvenv.cfg", "virtual environment (pyvenv.cfg)"), ("conda-meta", "conda environment"))


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str

    def to_dict(self) -> "SkippedFolderFacts":
        return {"path": self.path, "reason": self.reason}


@dataclass
class Discovery:
    files: List[str] = field(default_factory=list)
    skipped: List[Skipped] = field(default_factory=list)  # folders left out while walking, with why
    problems: List[Problem] = field(default_factory=list)  # folders that could not be listed


def _excluded(display: str, relative: str, patterns: Sequence[str]) -> bool:
    if not patterns:
        return False
    name = os.path.basename(display.rstrip("/\\")) or display
    candidates = (display.replace(os.sep, "/"), relative.replace(os.sep, "/"), name)
    return any(fnmatch.fnmatch(c, p) or fnmatch.fnmatch(c, p.rstrip("/")) for p in patterns for c in candidates)


def skip_reason(folder: str, name: str) -> str:
    """Why the walk leaves `folder/name` out ("" to enter it)."""
    if name in SKIPPED_DIR_NAMES:
        return SKIPPED_DIR_NAMES[name]
    for marker, reason in ENVIRONMENT_MARKERS:
        if os.path.exists(os.path.join(folder, name, marker)):
            return reason
    return ""


def discover(
    paths: Iterable[str],
    exclude: Sequence[str] = (),
    extensions: Sequence[str] = DEFAULT_EXTENSIONS,
    anchored: Tuple[str, Sequence[str]] = ("", ()),
) -> Discovery:
    """Files to scan, sorted and de-duplicated, spelled as the user spelled their roots.

    `anchored` is (folder, globs): excludes from a configuration file, matched against paths relative to its
    folder. A path named explicitly is always taken (even without a `.py` suffix) unless an exclude matches it; folders
    are walked without following links. A missing path is a UsageError, before anything is read. Whether each
    file is a regular file is decided when it is read (source.read_bytes), so a FIFO is never opened for reading.
    """
    roots = [os.fspath(p) for p in paths]
    missing = [p for p in roots if not os.path.lexists(p)]
    if missing:
        raise UsageError(f"no such file or directory: {', '.join(missing)}")
    result = Discovery()
    seen = set()
    anchor, anchored_globs = anchored

    def excluded(display: str, relative: str) -> bool:
        if _excluded(display, relative, exclude):
            return True
        return bool(anchored_globs) and any(
            matches(glob, relative_to(anchor, display)) for glob in anchored_globs)

    def take(path: str) -> None:
        # abspath, not realpath: realpath costs an lstat per path component, and walks never follow links.
        key = os.path.abspath(path)
        if key not in seen:
            seen.add(key)
            result.files.append(path)

    def unreadable(error: OSError) -> None:
        where = error.filename or "?"
        result.problems.append(Problem(
            os.fspath(where), f"cannot list folder: {error.strerror or error}",
            "check its permissions; nothing below it was scanned"))

    suffixes: Tuple[str, ...] = tuple(extensions)
    patterns = bool(exclude) or bool(anchored_globs)
    for root in roots:
        if not os.path.isdir(root):
            if not excluded(root, os.path.basename(root)):
                take(root)
            continue
        for folder, dirnames, filenames in os.walk(root, onerror=unreadable):
            relative_folder = os.path.relpath(folder, root) if patterns else ""
            kept = []
            for name in sorted(dirnames):
                full = os.path.join(folder, name)
                reason = skip_reason(folder, name)
                if not reason and patterns and excluded(full, os.path.normpath(os.path.join(relative_folder, name))):
                    reason = "excluded"
                if reason:
                    result.skipped.append(Skipped(os.path.normpath(full), reason))
                    continue
                kept.append(name)
            dirnames[:] = kept
            # A file's name holds no separator and is never "." or "..": its path is its folder's, normalised
            # once per folder, joined to the name (the walk of a big tree spent most of its time normalising).
            spelled = os.path.normpath(folder)
            absolute = os.path.abspath(spelled)
            for name in sorted(filenames):
                if not name.endswith(suffixes):
                    continue
                path = name if spelled == os.curdir else os.path.join(spelled, name)
                if patterns and excluded(path, os.path.normpath(os.path.join(relative_folder, name))):
                    continue
                key = os.path.join(absolute, name)
                if key not in seen:
                    seen.add(key)
                    result.files.append(path)
    return result
