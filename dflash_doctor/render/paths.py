"""Repository-relative paths for reports that leave the machine (SARIF, JUnit)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional


def repo_root(start: Optional[Path] = None) -> Path:
    """The nearest folder above `start` (default: cwd) holding .git, else `start` itself."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / ".git").exists():
            return folder
    return here


def relative_uri(path: str, root: Path) -> str:
    """`path` relative to `root` with forward slashes, percent-encoded as a URI reference must be (a space, a
    `#`, a byte that is not UTF-8); paths outside the root stay absolute file URIs."""
    absolute = Path(path).resolve()
    try:
        return _uri_reference(absolute.relative_to(root).as_posix())
    except ValueError:
        return absolute.as_uri() if absolute.is_absolute() else _uri_reference(Path(os.path.normpath(path)).as_posix())


def _uri_reference(posix_path: str) -> str:
    from urllib.parse import quote

    # os.fsencode gives back the file name's own bytes, undecodable ones included (PEP 383).
    return quote(os.fsencode(posix_path), safe="/!$&'()*+,;=:@")
