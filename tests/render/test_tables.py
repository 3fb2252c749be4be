"""Tables that fit: at 40, 80 and 200 columns, on a terminal and into a file, every column's content is shown
whole (a table, a table with wrapped cells, or a list), never squeezed into slivers and never dropped."""
from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from dflash_doctor.render.tables import Column, fitted, layout
from tests.conftest import REPO, run_cli_json
from tests.repro.example_facts import phase, repro_facts, thread

WIDTHS = (40, 80, 200)
TARGETS = [(width, terminal) for width in WIDTHS for terminal in (True, False)]


def console(width: int, terminal: bool) -> Console:
    # as render/text.py's console draws (soft wrap: a file gets whole lines), without colour codes to strip
    return Console(file=io.StringIO(), width=width, force_terminal=terminal, color_system=None, soft_wrap=True,
                   highlight=False, emoji=False)


def drawn(view, facts, width, terminal) -> str:
    out = console(width, terminal)
    view(out, facts)
    return out.file.getvalue()


def squashed(text: str) -> str:
    return re.sub(r"\s+", "", text)


def words(text: str) -> set:
    return set(text.split())


COLUMNS = [Column("hazard", wrap=False), Column("verdict", wrap=False), Column("decided by"), Column("fixes here")]
ROWS = [["FX-flag leak across threads", "present", "_dynamo/eval_frame.py:1120, fx/_symbolic_trace.py:44",
         "global-lock, warmup, threadlocal-flag, processes; not non-lazy-backward: it does not stop this hazard"],
        ["compile-lock / autograd-device-thread deadlock", "absent", "-", "-"]]


@pytest.mark.parametrize("width, terminal", TARGETS)
def test_every_cell_survives_whole_in_whatever_layout_is_chosen(width, terminal):
    out = console(width, terminal)
    out.print(fitted(out, COLUMNS, ROWS))
    text = out.file.getvalue()
    chosen = layout(out, COLUMNS, ROWS)
    for row in ROWS:
        for cell in row:
            if chosen == "wrapped":  # cells broken at spaces only: every word is there, none cut
                assert words(cell) <= words(text), (cell, text)
            else:  # one line per cell: the cell is on it as it is
                assert cell in text, (chosen, cell, text)
    # never a column narrower than it can be read in, never a header lost
    assert all(column.header in text for column in COLUMNS)


def test_the_layout_follows_width_and_terminal():
    assert layout(console(240, False), COLUMNS, ROWS) == "table"  # every cell fits on its line
    assert layout(console(120, True), COLUMNS, ROWS) == "wrapped"
    assert layout(console(120, False), COLUMNS, ROWS) == "list"  # a file: no cell wrapped into its neighbours
    assert layout(console(40, True), COLUMNS, ROWS) == "list"


@pytest.fixture(scope="module")
def guards_facts():
    proc, doc = run_cli_json("guards", "--no-probes", timeout=110)
    assert doc["facts"]["hazards"], proc.stderr
    facts = dict(doc["facts"])
    # the probes table with the long details a real run gives (this run read the source only)
    facts["probe_details"] = {name: {"outcome": "reproduced", "seconds": 0.12,
                                     "detail": f"{name}: thread B raised while thread A traced: Detected that you "
                                               "are using FX to symbolically trace a dynamo-optimized function."}
                              for name in ("cross_thread_leak", "stuck_flag", "is_compiling_leak")}
    return facts


@pytest.mark.parametrize("width, terminal", TARGETS)
def test_guards_hazards_and_probes_keep_decided_by_and_fixes(guards_facts, width, terminal):
    from dflash_doctor.render.guards_view import guards_view

    text = drawn(guards_view, guards_facts, width, terminal)
    root = guards_facts["torch_root"]
    import os

    for hazard in guards_facts["hazards"].values():
        assert hazard["title"] in text
        for cited in hazard.get("cited") or []:
            assert f"{os.path.relpath(cited['file'], root)}:{cited['line']}" in squashed(text)
        for fix in hazard.get("fixes") or []:
            assert fix in words(text) or f"{fix}," in words(text), (fix, text)
    for name, detail in guards_facts["probe_details"].items():
        assert name in text and words(detail["detail"]) <= words(text)


@pytest.fixture(scope="module")
def logs_facts():
    _, doc = run_cli_json("logs", REPO / "fixtures" / "logs" / "seed003_grep.log")
    assert doc["facts"]["threads"]
    return doc["facts"]


@pytest.mark.parametrize("width, terminal", TARGETS)
def test_logs_keep_who_died(logs_facts, width, terminal):
    from dflash_doctor.render.logs_view import render_logs

    text = drawn(render_logs, logs_facts, width, terminal)
    for name, thread in logs_facts["threads"].items():
        assert name in text
        if thread.get("died"):
            assert f"died line {thread['died']['line']}" in text and thread["died"]["code"] in text


@pytest.fixture(scope="module")
def gpus_facts():
    _, doc = run_cli_json("gpus", "--from", REPO / "fixtures" / "gpus" / "seed003_snapshot.csv", "--roles",
                          "target=0-4,drafter=5-7")
    return doc["facts"]


@pytest.mark.parametrize("width, terminal", TARGETS)
def test_gpus_keep_index_role_and_figures(gpus_facts, width, terminal):
    from dflash_doctor.render.gpus_view import render_gpus

    text = drawn(render_gpus, gpus_facts, width, terminal)
    lines = text.splitlines()
    for gpu in gpus_facts["gpus"]:
        role, util = gpu["role"], f"{gpu['utilization']:.0f} %"
        # index and role together: on one table row, or a list block headed by the index
        row = [line for line in lines if re.match(rf"^\s*{gpu['index']}\s+{role}\s", line)]
        block = [i for i, line in enumerate(lines) if line.strip() == str(gpu["index"])]
        assert row or (block and lines[block[0] + 1].strip() == f"role: {role}"), text
        assert util in text and f"{gpu['memory_used_mib'] / 1024:.1f}" in text


REPRO_FACTS = repro_facts(
    mode="forced", cache="warm", verdict="reproduced", kind="fx-flag-leak", level="forced", time_to_verdict_s=6.8,
    levels={"forced": {"ran": 1, "reproduced": 1, "kinds": {"fx-flag-leak": 1}}},
    single_thread=phase("ok", [thread("drafter-0")], seconds=3.25, steps_per_s=1.5),
    multi_thread=phase("error", [thread(f"drafter-{i}", "error") for i in range(3)], seconds=6.5),
)


@pytest.mark.parametrize("width, terminal", TARGETS)
def test_repro_phases_keep_outcome_time_rate_and_threads(width, terminal):
    from dflash_doctor.render.repro_view import render_repro_facts

    text = drawn(render_repro_facts, REPRO_FACTS, width, terminal)
    for cell in ("single-thread", "3 threads", "ok", "error", "3.2", "6.5", "1.50", "1 ok", "3 error"):
        assert cell in words(text) or cell in text, (cell, text)
    assert text.splitlines()[-1] == "verdict: reproduced (fx-flag-leak) under forced stress, 1/1 trials; first at 6.8 s"
