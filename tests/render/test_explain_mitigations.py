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
    # no Markdown of the page's own (a registry text may quote code in backticks: that is its content)
    for markup in ("<!--", "|---", "**", "###", "- stops:", " _measured_", " _inferred_"):
        assert markup not in text, markup
    flat = " ".join(text.split())
    def one_line(text: str) -> str:
        return " ".join(text.split())

    for entry in registry.REGISTRY:
        assert one_line(f"{entry.name}{' (not a fix)' if not entry.recommended else ''}: {entry.summary}") in flat
        assert one_line(f"apply: {entry.api}") in flat and one_line(f"cost: {entry.cost}") in flat
        for caveat in registry.caveats_for((entry.name,)):
            assert one_line(f"leaves open: {caveat}") in flat
    assert "torch 2.10 - 2.13" in flat and "1. threadlocal-flag,non-lazy-backward" in flat
    assert "with a thread running its own FX trace:" in flat


def test_one_mitigation_alone():
    proc = run_cli("explain", "warmup", timeout=60)
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0] == f"warmup: {registry.get('warmup').summary}"
    assert "Ranking per release" not in proc.stdout
