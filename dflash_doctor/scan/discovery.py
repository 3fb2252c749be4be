"""Which files a scan reads: the paths given, walked for `.py` files, minus excludes and other people's code."""
from __future__ import annotations

import fnmatch
import os
from typing import Iterable, List, Sequence

from dflash_doctor.errors import UsageError

DEFAULT_EXTENSIONS = (".py",)
# Never the user's own code: version control, caches, installed environments.
SKIPPED_DIR_NAMES = frozenset({
    ".git", ".hg", ".svn", "__pycache__", "node_modules", ".tox", ".nox", ".venv", "venv", "env",
    ".mypy_cache", ".pytest_cache", ".ruff_cache", ".eggs",
})
# Installed packages are skipped while walking, but scanned when the user points at them (or inside them).
INSTALLED_DIR_NAMES = frozenset({"site-packages", "dist-packages"})


def _excluded(display: str, relative: str, patterns: Sequence[str]) -> bool:
    if not patterns:
        return False
    name = os.path.basename(display.rstrip("/\\")) or display
    candidates = (display.replace(os.sep, "/"), relative.replace(os.sep, "/"), name)
    return any(fnmatch.fnmatch(c, p) or fnmatch.fnmatch(c, p.rstrip("/")) for p in patterns for c in candidates)


def _skipped_dir(folder: str, name: str) -> bool:
    return (
        name in SKIPPED_DIR_NAMES
        or name in INSTALLED_DIR_NAMES
        or os.path.isfile(os.path.join(folder, name, "pyvenv.cfg"))
    )


def discover(
    paths: Iterable[str],
    exclude: Sequence[str] = (),
    extensions: Sequence[str] = DEFAULT_EXTENSIONS,
) -> List[str]:
    """Files to scan, sorted and de-duplicated, spelled as the user spelled their roots.

    A path named explicitly is always taken (even without a `.py` suffix) unless an exclude matches it; folders
    are walked without following links. A missing path is a UsageError, before anything is read.
    """
    roots = [os.fspath(p) for p in paths]
    missing = [p for p in roots if not os.path.exists(p)]
    if missing:
        raise UsageError(f"no such file or directory: {', '.join(missing)}")
    found: List[str] = []
    seen = set()

    def take(path: str) -> None:
        # abspath, not realpath: realpath costs an lstat per path component, and walks never follow links.
        key = os.path.abspath(path)
        if key not in seen:
            seen.add(key)
            found.append(path)

    for root in roots:
        if os.path.isfile(root):
            if not _excluded(root, os.path.basename(root), exclude):
                take(root)
            continue
        for folder, dirnames, filenames in os.walk(root):
            relative_folder = os.path.relpath(folder, root)
            kept = []
            for name in sorted(dirnames):
                relative = os.path.normpath(os.path.join(relative_folder, name))
                if _skipped_dir(folder, name) or _excluded(os.path.join(folder, name), relative, exclude):
                    continue
                kept.append(name)
            dirnames[:] = kept
            for name in sorted(filenames):
                if not name.endswith(tuple(extensions)):
                    continue
                path = os.path.normpath(os.path.join(folder, name))
                if not _excluded(path, os.path.normpath(os.path.join(relative_folder, name)), exclude):
                    take(path)
    return found
