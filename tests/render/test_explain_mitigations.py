"""`explain mitigations` is drawn for a terminal: the registry's words, no Markdown markup, no HTML comment."""
from __future__ import annotations

import pytest

from dflash_doctor import mitigations as registry
from tests.conftest import run_cli


@pytest.mark.parametrize("width", ("40", "200"))
def test_every_mitigation_and_its_fields_without_markdown(width):
    proc = run_cli("explain", "mitigations", env={"COLUMNS": width}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "<!--" not in text and "|---" not in text and "**" not in text and "###" not in text and "`" not in text
    flat = " ".join(text.split())
    for entry in registry.REGISTRY:
        assert f"{entry.name}{' (not a fix)' if not entry.recommended else ''}: {entry.summary}" in flat
        assert f"apply: {entry.api}" in flat and f"cost: {' '.join(entry.cost.split())}" in flat
        for caveat in registry.caveats_for((entry.name,)):
            assert f"leaves open: {' '.join(caveat.split())}" in flat
    assert "torch 2.10 - 2.13" in flat and "1. threadlocal-flag,non-lazy-backward" in flat


def test_one_mitigation_alone():
    proc = run_cli("explain", "warmup", timeout=60)
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0] == f"warmup: {registry.get('warmup').summary}"
    assert "Ranking per release" not in proc.stdout
