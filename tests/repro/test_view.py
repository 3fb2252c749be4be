"""The per-thread timeline is computed as data (rows of glyphs) before rich draws it."""
from __future__ import annotations

from dflash_doctor.render.repro_view import timeline_rows
from tests.repro.example_facts import repro_facts


def ev(t, thread, kind, phase):
    return {"t": t, "thread": thread, "tid": hash(thread) % 1000, "kind": kind, "phase": phase, "detail": {}}


def test_spans_and_instants_land_in_their_columns_and_exceptions_win():
    events = [
        ev(0.0, "fx-holder", "fx-trace", "B"),
        ev(0.0, "drafter-0", "step", "B"),
        ev(0.5, "drafter-0", "compile", "B"),
        ev(0.7, "drafter-0", "compile", "E"),
        ev(0.9, "drafter-0", "exception", "I"),
        ev(0.9, "drafter-0", "step", "E"),
        ev(1.0, "fx-holder", "fx-trace", "E"),
        ev(1.0, "MainThread", "note", "I"),
    ]
    rows = dict(timeline_rows(events, width=10))
    assert rows["fx-holder"] == "TTTTTTTTTT"
    assert rows["drafter-0"] == "=====CCC=X"
    assert "MainThread" not in rows  # a thread with nothing to draw gets no row


def test_a_span_still_open_at_the_end_runs_to_the_last_event():
    rows = dict(timeline_rows([ev(0.0, "a", "step", "B"), ev(2.0, "watchdog", "hang", "I")], width=4))
    assert rows == {"a": "====", "watchdog": "···H"}


def test_no_events_no_rows():
    assert timeline_rows([]) == []


def test_the_text_view_ends_with_the_next_steps():
    import io

    from rich.console import Console

    from dflash_doctor.render.repro_view import render_repro_facts

    console = Console(file=io.StringIO(), width=200, color_system=None)
    render_repro_facts(console, repro_facts(mode="natural", verdict="not-reproduced", time_to_verdict_s=1.0,
                                            wall_s=2.5, levels={"natural": {"ran": 3, "reproduced": 0, "kinds": {}}},
                                            next_steps=["first thing", "second [thing]"]))
    lines = console.file.getvalue().splitlines()
    assert lines[-3] == "verdict: not reproduced (natural 0/3) in 2.5 s"
    assert lines[-2:] == ["next: first thing", "next: second [thing]"]


def test_verdict_line_names_the_stress_and_the_rate():
    from dflash_doctor.render.repro_view import verdict_line

    facts = repro_facts(verdict="reproduced", kind="deadlock", level="natural", time_to_verdict_s=28.2,
                        levels={"natural": {"ran": 3, "reproduced": 2, "kinds": {"deadlock": 2}}})
    assert verdict_line(facts) == ("verdict: reproduced (deadlock) under natural stress, 2/3 trials; first at "
                                   "28.2 s")


def test_matrix_cells_show_per_stress_counts_kinds_and_skips():
    from dflash_doctor.render.repro_view import stress_cells

    assert stress_cells({"natural": {"ran": 3, "reproduced": 0, "kinds": {}},
                         "amplified": {"ran": 2, "reproduced": 1, "kinds": {"fx-flag-leak": 1}},
                         "forced": {"ran": 0, "reproduced": 0, "kinds": {}, "skipped": "thread-local"},
                         "stuck": {"ran": 0, "reproduced": 0, "kinds": {}}}) == (
        "natural 0/3 · amplified 1/2 leak · forced skip · stuck -")
