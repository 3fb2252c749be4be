"""The install commands the docs give work without a package index: none asks an index for dflash-doctor, and
torch is always pinned (an unpinned torch can resolve to a multi-GB CUDA build)."""
from __future__ import annotations

import re
import shlex

import pytest

from tests.conftest import REPO

DOCS = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")),
        "examples/github-actions.yml"]


def _pip_installs(text: str):
    for line in text.splitlines():
        match = re.search(r"pip install (.*)", line)
        if match and "`pip install dflash-doctor` finds nothing" not in line:
            yield match.group(1).split("#")[0].split("&&")[0].strip()


@pytest.mark.parametrize("name", DOCS)
def test_every_pip_install_of_the_tool_names_a_path_or_url_and_pins_torch(name):
    for command in _pip_installs((REPO / name).read_text(encoding="utf-8")):
        words = [w for w in shlex.split(command) if not w.startswith("-")]
        for word in words:
            if "torch" in word and "dflash" not in word:
                assert word.startswith("torch==") or word in ("torch", "transformers"), (name, command)
            if "dflash-doctor" in word or "dflash_doctor" in word:
                assert word.startswith(("git+", "./", "/")) or word.startswith("."), (name, command)
        assert "dflash-doctor" not in words, f"{name}: `{command}` asks a package index that has no dflash-doctor"
