"""Text view of repro facts: the phases, who blamed whom, the hang chain, a per-thread timeline, the matrix."""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

from dflash_doctor.outcomes import FailureKind, RecorderEventKind, ThreadOutcome

if TYPE_CHECKING:
    from rich.console import Console

    from dflash_doctor.repro.facts import EventFacts, LevelFacts, MatrixRowFacts, PhaseFacts, ReproFacts

TIMELINE_WIDTH = 60
# Later entries win when several things fall into one column.
_GLYPHS = ((RecorderEventKind.STEP, "="), (RecorderEventKind.COMPILE, "C"), (RecorderEventKind.FX_TRACE, "T"),
           (RecorderEventKind.STUCK_FLAG, "!"), (RecorderEventKind.HANG, "H"), (RecorderEventKind.EXCEPTION, "X"))
# keyed by the words, which the events of a phase's facts carry
_PRIORITY: Dict[str, int] = {kind: rank for rank, (kind, _) in enumerate(_GLYPHS)}
_GLYPH: Dict[str, str] = dict(_GLYPHS)
_OUTCOME_STYLE: Dict[Optional[str], str] = {ThreadOutcome.OK: "green", ThreadOutcome.ERROR: "bold red",
                                             ThreadOutcome.HUNG: "bold magenta"}


def _spans(events: Sequence[EventFacts]) -> Dict[str, List[Tuple[str, float, float]]]:
    """Per thread: (kind, start, end) for begin/end pairs and instants (start == end)."""
    open_: Dict[Tuple[str, str], List[float]] = {}
    spans: Dict[str, List[Tuple[str, float, float]]] = {}
    last = max((e["t"] for e in events), default=0.0)
    for event in events:
        thread, kind, t = event["thread"], event["kind"], event["t"]
        spans.setdefault(thread, [])
        if event["phase"] == "B":
            open_.setdefault((thread, kind), []).append(t)
        elif event["phase"] == "E":
            starts = open_.get((thread, kind))
            if starts:
                spans[thread].append((kind, starts.pop(), t))
        else:
            spans[thread].append((kind, t, t))
    for (thread, kind), starts in open_.items():  # still running when the phase ended (a hang)
        spans[thread].extend((kind, start, last) for start in starts)
    return spans


def timeline_rows(events: Sequence[EventFacts], width: int = TIMELINE_WIDTH) -> List[Tuple[str, str]]:
    """(thread, row of glyphs) with one column per 1/width of the phase; pure, so it is tested directly."""
    if not events:
        return []
    first = min(e["t"] for e in events)
    last = max(e["t"] for e in events)
    scale = (last - first) or 1.0
    rows = []
    for thread, spans in _spans(events).items():
        cells: List[Optional[str]] = [None] * width
        for kind, start, end in spans:
            if kind not in _PRIORITY:
                continue
            lo = min(width - 1, int((start - first) / scale * width))
            hi = min(width - 1, int((end - first) / scale * width))
            for column in range(lo, hi + 1):
                shown = cells[column]
                if shown is None or _PRIORITY[kind] > _PRIORITY[shown]:
                    cells[column] = kind
        if any(cells):
            rows.append((thread, "".join(_GLYPH[c] if c else "·" for c in cells)))
    return sorted(rows)


def _phase_row(label: str, phase: Optional[PhaseFacts]) -> Optional[List[str]]:
    if not phase:
        return None
    threads = phase["threads"]
    counts = {o: sum(1 for t in threads if t["outcome"] == o)
              for o in (ThreadOutcome.OK, ThreadOutcome.ERROR, ThreadOutcome.HUNG)}
    summary = ", ".join(f"{n} {o}" for o, n in counts.items() if n)
    rate = phase["steps_per_s"]
    style = _OUTCOME_STYLE.get(phase["outcome"], "")
    return [label, f"[{style}]{phase['outcome']}[/]", f"{phase['seconds']:.1f}",
            f"{rate:.2f}" if rate else "-", summary]


_WORD_STYLE: Dict[Optional[str], str] = {"fails": "bold red", "holds": "bold green", "inconclusive": "yellow",
                                          "reproduced": "bold red", "not-reproduced": "green",
                                          "reproduced-if-traced": "yellow"}
def verdict_words(facts: ReproFacts) -> str:
    """The verdict in words: which race, under which stress, how often, and when it first showed (the run's
    clock, as the progress lines give it); or where nothing showed."""
    verdict = facts["verdict"]
    if verdict is None:
        return "no verdict (no trial ran to an end)"
    levels = facts.get("levels") or {}
    if verdict == "reproduced-if-traced":
        level = facts["level"]
        entry = levels.get(level) if level is not None else None
        counted = f"{entry['reproduced']}/{entry['ran']}" if entry else "?/?"
        own = ", ".join(f"{stress} 0/{e['ran']}" for stress, e in levels.items()
                        if e["ran"] and stress in ("natural", "amplified"))
        return (f"not reproduced by the step's own threads ({own or 'natural and amplified did not run'}); "
                f"{facts['kind']} only under the injected {level} stress ({counted} trials): the step fails IF a "
                "thread traces with FX while it runs")
    if verdict == "reproduced":
        level = facts["level"]
        entry = levels.get(level) if level is not None else None
        counted = f"{entry['reproduced']}/{entry['ran']}" if entry else "?/?"
        return (f"reproduced ({facts['kind']}) under {level} stress, {counted} trials; first at "
                f"{facts['time_to_verdict_s']:.1f} s")
    ran = ", ".join(f"{stress} 0/{entry['ran']}" for stress, entry in levels.items() if entry["ran"])
    wall = facts.get("wall_s")
    took = f" in {wall:.1f} s" if wall is not None else ""
    return f"not reproduced ({ran or 'no stress could run here'}){took}"


def verdict_line(facts: ReproFacts) -> str:
    """The headline: `verdict: ` and the verdict in words."""
    return f"verdict: {verdict_words(facts)}"


def _shared_words(facts: ReproFacts) -> str:
    """` (forced, stuck trials and every processes trial: one shared)`, or nothing where every trial was cold."""
    parts = ([f"{', '.join(facts['shared_cache'])} trials"] if facts["shared_cache"] else []) + [
        f"every {label} trial" for label in facts.get("shared_cache_fixes") or []]
    return f" ({' and '.join(parts)}: one shared)" if parts else ""


def render_repro_facts(console: Console, facts: ReproFacts) -> None:
    from rich.markup import escape

    from dflash_doctor.render.tables import Column, fitted

    console.print(
        f"[bold]repro[/] torch {escape(str(facts['torch_version']))} · device "
        f"{escape(facts['device'])} · {facts['threads']} threads · mode {facts['mode']} · "
        f"mitigation {escape(facts['mitigation'])} · cache {facts['cache']}"
        + _shared_words(facts)
    )
    for line in facts["capabilities"]["cannot_show"]:
        console.print(f"[dim]note: {escape(line)}[/]")
    shim = facts.get("shim")
    if shim:
        check = shim["self_check"]
        console.print(f"threadlocal-flag shim: {shim['state']}"
                      f"{' · self-check ' + ('passed' if check['ok'] else 'FAILED') if check else ''}")
    columns = [Column("phase", wrap=False), Column("outcome", wrap=False), Column("took s", "right", wrap=False),
               Column("steps/s", "right", wrap=False), Column("threads")]
    phases = [row for row in (_phase_row("single-thread", facts["single_thread"]),
                              _phase_row(f"{facts['threads']} threads", facts["multi_thread"])) if row]
    console.print(fitted(console, columns, phases))
    levels = facts.get("levels")
    if levels:
        console.print(f"stresses: {escape(stress_cells(levels))}")
    multi = facts["multi_thread"]
    disturbance = multi.get("disturbance") if multi else None
    if disturbance:
        console.print(f"[dim]{escape(disturbance)}[/]")
    for thread in multi["threads"] if multi else []:
        error = thread["error"]
        if error:
            console.print(f"  {escape(thread['name'])}: [red]{escape(error[:200])}[/]")
    for blame in facts["blame"]:
        # No time here: the trial's end (in the progress lines and the verdict) is the one time it is given.
        console.print(f"  blame: {escape(blame['victim'])} failed while the FX flag was held by "
                      f"[bold]{escape(str(blame['holder']))}[/]")
    hang = facts.get("hang")
    if hang:
        console.print(f"[bold magenta]hung[/] ({hang['cycle']}):")
        for step in hang["chain"]:
            console.print(f"  {escape(step)}")
    rows = timeline_rows(multi["events"] if multi else [])
    if rows:
        console.print("[bold]timeline[/] [dim](= step, C compile, T FX trace, ! flag stuck, H hang, X exception)[/]")
        for thread_name, row in rows:
            console.print(f"  {escape(thread_name):>16} {row}")
    matrix = facts.get("matrix")
    if matrix:
        render_matrix(console, matrix)
    style = _WORD_STYLE.get(facts["verdict"], "bold green") if facts["verdict"] != "not-reproduced" else "bold green"
    console.print(f"[{style}]{escape(verdict_line(facts))}[/]")
    outcome = facts.get("outcome")
    if outcome:
        console.print(f"mitigation {escape(facts['mitigation'])}: [{_WORD_STYLE.get(outcome, '')}]{outcome}[/] "
                      f"[dim]({escape(facts.get('outcome_reason', ''))})[/]")
    for line in facts.get("next_steps") or []:
        console.print(f"[dim]next:[/] {escape(line)}")


# Keyed by the kind's word: a kind read back from JSON is a plain str, equal to its FailureKind.
_KIND_SHORT: Dict[str, str] = {FailureKind.FX_FLAG_LEAK: "leak", FailureKind.STUCK_FLAG: "stuck",
                               FailureKind.DEADLOCK: "deadlock", FailureKind.OTHER_ERROR: "other"}


def stress_cells(tally: Mapping[str, LevelFacts]) -> str:
    """`natural 0/1 +2 decided · amplified 1/1 leak · forced skip`: per stress, reproduced/ran, the kinds seen,
    and the planned trials not waited for once the row was decided."""
    cells = []
    for stress, entry in tally.items():
        early = entry.get("stopped_early")
        decided = f" +{early} decided" if early else ""
        if entry.get("skipped"):
            cells.append(f"{stress} skip")
        elif entry["ran"]:
            kinds = " ".join(_KIND_SHORT.get(k, k) for k in entry["kinds"])
            cells.append(f"{stress} {entry['reproduced']}/{entry['ran']}" + (f" {kinds}" if kinds else "") + decided)
        else:
            cells.append(f"{stress} -{decided}")
    return " · ".join(cells)


def render_matrix(console: Console, rows: Sequence[MatrixRowFacts]) -> None:
    from rich.markup import escape

    console.print("[bold]mitigation matrix[/] [dim](per stress: trials that reproduced / trials run)[/]")
    width = max(len(row["mitigation"]) for row in rows)
    for row in rows:
        word = row["outcome"]
        rate = row["steps_per_s"]
        console.print(f"  {escape(row['mitigation']).ljust(width)}  [{_WORD_STYLE.get(word, '')}]{word:<14}[/] "
                      f"{escape(stress_cells(row['stresses']))}{f' · {rate:.2f} steps/s' if rate else ''}")
