"""Where the torch sources under analysis come from: an installed package, a folder, or a stand-in bundle.

The layout analyzer only ever asks for a file by its path relative to the `torch` package folder
(`_dynamo/eval_frame.py`), so the real installed torch, an unpacked wheel and the hand-written stand-ins in the
tests and rule examples all go through the same code.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Mapping, Optional

from dflash_doctor.errors import UsageError

# `torch-layout` rule examples and test bundles hold several stand-in files in one text, each introduced by a
# header line naming its path inside the torch package, like the headers `head` prints for several files.
_BUNDLE_HEADER = re.compile(r"^# ==> (?P<path>[\w./]+) <==[ \t]*$", re.MULTILINE)


class SourceTree:
    """Read-only access to torch sources by package-relative path; unreadable or absent files read as None."""

    label = ""

    def read(self, relpath: str) -> Optional[str]:
        raise NotImplementedError

    def display_path(self, relpath: str) -> str:
        raise NotImplementedError


class DirectoryTree(SourceTree):
    def __init__(self, root: Path):
        self.root = Path(root)
        self.label = str(self.root)

    def read(self, relpath: str) -> Optional[str]:
        try:
            return (self.root / relpath).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None

    def display_path(self, relpath: str) -> str:
        return str(self.root / relpath)


class MappingTree(SourceTree):
    def __init__(self, files: Mapping[str, str], label: str = "<stand-in>"):
        self.files: Dict[str, str] = dict(files)
        self.label = label

    def read(self, relpath: str) -> Optional[str]:
        return self.files.get(relpath)

    def display_path(self, relpath: str) -> str:
        return f"torch/{relpath}"


def parse_bundle(text: str) -> Dict[str, str]:
    """Split a stand-in bundle (`# ==> fx/_symbolic_trace.py <==` headers) into {relpath: source}."""
    headers = list(_BUNDLE_HEADER.finditer(text))
    if not headers:
        raise UsageError("a torch-layout bundle needs at least one '# ==> PATH <==' header line")
    files: Dict[str, str] = {}
    for index, header in enumerate(headers):
        end = headers[index + 1].start() if index + 1 < len(headers) else len(text)
        files[header.group("path")] = text[header.end():end].lstrip("\n")
    return files


def installed_torch_root() -> Optional[Path]:
    """The folder of the importable `torch` package, found without importing it (None when there is none)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def is_accelerator_build(torch_root: Optional[Path]) -> bool:
    """Whether the torch at `torch_root` is a CUDA or ROCm build, read from its generated version.py (no import)."""
    import re

    try:
        text = (torch_root / "version.py").read_text(encoding="utf-8") if torch_root else ""
    except OSError:
        return False
    return any(
        match.group(2) not in ("None", "")
        for match in re.finditer(r"^(cuda|hip)\s*(?::[^=]*)?=\s*['\"]?([^'\"\n]*)", text, re.MULTILINE)
    )
