"""Text view of `guards` facts: versions, the guard's source with the flag highlighted, the backward compile, state,
caches, probes, a verdict per hazard, the headline and ranked fixes. Draws only what the facts hold; the findings
follow it (render/text.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Sequence

import textwrap

from dflash_doctor.mitigations import FixKind

if TYPE_CHECKING:
    from rich.console import Console

    from dflash_doctor.guards.facts import GuardsFacts

_VERDICT_STYLE = {"vulnerable": "bold red", "safe": "bold green", "unknown": "bold magenta"}
_STATE_STYLE = {"present": "red", "absent": "green", "unknown": "magenta"}
_OUTCOME_STYLE = {"reproduced": "red", "not-reproduced": "green", "skipped": "dim", "error": "magenta"}
HIGHLIGHT = "bold black on yellow"


def guards_view(console: Console, facts: GuardsFacts) -> None:
    from rich.markup import escape

    _versions(console, facts)
    _guard(console, facts)
    _backward(console, facts)
    _compile_settings(console, facts)
    _state(console, facts)
    _probes(console, facts)
    _hazards(console, facts)
    verdict = facts.get("verdict", "unknown")
    worst = (facts.get("hazards") or {}).get(facts.get("worst_hazard") or "", {}).get("title")
    console.print(f"\n[bold]Verdict[/] [{_VERDICT_STYLE.get(verdict, 'bold')}]{escape(verdict.upper())}[/]"
                  + (f": worst is the {escape(worst)}" if worst else ""))
    for reason in facts.get("verdict_reasons", []):
        console.print(f"  - {escape(reason)}")
    _fixes(console, facts.get("fixes") or [])
    console.print()


def _versions(console: Console, facts: GuardsFacts) -> None:
    from rich.markup import escape

    versions = facts.get("versions") or {}
    parts = [f"torch {versions.get('torch') or '?'} ({versions.get('torch_build', '?')} build)"]
    if "python" in versions:  # the installed torch's host; --torch-root describes the tree alone
        gpus = versions.get("gpu_count")
        parts += [f"Python {versions.get('python', '?')}", f"triton {versions.get('triton') or '-'}",
                  f"transformers {versions.get('transformers') or '-'}", f"GPUs {'?' if gpus is None else gpus}"]
    console.print("[bold]" + escape(" · ".join(parts)) + "[/]")
    console.print(f"[dim]read from {escape(str(facts.get('torch_root', '?')))}[/]")
    table = facts.get("corroboration") or {}
    if table.get("consulted") is False:
        console.print(f"[yellow]torch {escape(str(table.get('release') or '?'))} is not in the built-in release table "
                      f"({escape(str(table.get('table_releases')))}): the table was not consulted; every verdict "
                      "below is derived from this source alone[/]")
    elif table.get("agrees"):
        console.print(f"[dim]release table row {escape(table['release'])} (read from the {escape(table['read_from'])} "
                      "wheel) agrees with this source[/]")
    elif table.get("consulted"):
        console.print(f"[yellow]release table row {escape(table['release'])} differs in "
                      f"{escape(', '.join(table['differences']))}: the source read here decides[/]")


def _guard(console: Console, facts: GuardsFacts) -> None:
    from rich.markup import escape

    guard = facts.get("guard") or {}
    console.print()
    if not guard.get("file"):
        console.print("[bold]Guard[/] [magenta]not found[/]")
        for note in facts.get("layout_notes", []):
            console.print(f"  [dim]{escape(note)}[/]")
        return
    bound = ", looked up once when the wrapper is created" if guard.get("bound_at_wrap") else ""
    console.print(f"[bold]Guard[/] {escape(guard.get('function', '?'))} raises at "
                  f"{escape(guard['file'])}:{guard['line']} when [bold]{escape(guard['predicate'])}()[/] is true"
                  f"{escape(bound)}")
    _source(console, guard.get("source") or [], guard["predicate"])
    flag = facts.get("fx_flag")
    if flag is None:
        console.print("[bold]FX flag[/] [magenta]unknown[/]")
        for note in facts.get("layout_notes", [])[1:]:
            console.print(f"  [dim]{escape(note)}[/]")
        return
    shown = f"{flag['name']}.{flag['attribute']}" if flag.get("attribute") else flag["name"]
    writer = f", written by {flag['writer']} (line {flag['writer_line']})" if flag.get("writer") else ""
    if flag.get("restores_saved_value"):
        writer += " with save/set/restore"
    style = "red" if flag["storage"] == "module-global" else "green"
    console.print(f"[bold]FX flag[/] {escape(shown)}: [{style}]{flag['storage']}[/] "
                  f"({escape(flag['file'])}:{flag['line']}){escape(writer)}")
    _source(console, flag.get("source") or [], flag["name"])
    compiling = facts.get("compiling_flag") or {}
    masking = compiling.get("masking")
    if masking:
        inner = compiling.get("flag") or {}
        console.print(f"[bold]Masked during compile[/] yes: {escape(masking['function'])} "
                      f"({escape(masking['file'])}:{masking['line']}) enters {escape(masking['context'])}; "
                      f"{escape(inner.get('name', '?'))} is {escape(inner.get('storage', '?'))}")
    elif compiling.get("consulted_by_predicate"):
        console.print("[bold]Masked during compile[/] no: the predicate checks is_compiling(), but Dynamo "
                      "compiles do not set it")
    else:
        console.print("[bold]Masked during compile[/] no: the predicate does not check is_compiling()")


def _source(console: Console, lines: Sequence[Sequence[Any]], token: str) -> None:
    for row in source_rows(lines, token):
        console.print(row)


def source_rows(lines: Sequence[Sequence[Any]], token: str) -> List[Any]:
    """Numbered source lines as rich Texts, dedented, every occurrence of `token` highlighted, gaps marked."""
    from rich.text import Text

    if not lines:
        return []
    body = textwrap.dedent("\n".join(text for _, text in lines)).split("\n")
    width = len(str(lines[-1][0]))
    rows, previous = [], None
    for (number, _), text in zip(lines, body):
        if previous is not None and number != previous + 1:
            rows.append(Text(f"  {'':>{width}} ┆", style="dim"))
        row = Text(f"  {number:>{width}} │ ", style="dim")
        code = Text(text)
        code.highlight_words([token], style=HIGHLIGHT)
        row.append_text(code)
        rows.append(row)
        previous = number
    return rows


def _backward(console: Console, facts: GuardsFacts) -> None:
    from rich.markup import escape

    backward = facts.get("backward_compile") or {}
    compiler, lock, lazy, option = (backward.get(key) for key in ("compiler", "lock", "lazy", "non_lazy_option"))
    if compiler is None:
        console.print("[bold]Backward compile[/] [magenta]not found[/]")
    elif lock is None:
        console.print(f"[bold]Backward compile[/] {escape(compiler['function'])} ({escape(compiler['file'])}:"
                      f"{compiler['line']}) takes [green]no compile_lock[/]")
    else:
        console.print(f"[bold]Backward compile[/] {escape(' -> '.join(backward.get('path') or []))} takes "
                      f"[red]compile_lock[/] ({escape(lock['file'])}:{lock['line']})")
    if lazy is not None:
        console.print(f"[bold]Lazy backward[/] yes: {escape(lazy['function'])} ({escape(lazy['file'])}:"
                      f"{lazy['line']}) compiles it at the first backward")
    else:
        console.print("[bold]Lazy backward[/] [magenta]not recognised[/]")
    if option is not None:
        console.print(f"[bold]Non-lazy switch[/] torch._functorch.config.force_non_lazy_backward_lowering "
                      f"({escape(option['file'])}:{option['line']})")
    elif backward.get("non_lazy_backward_available") is False:
        console.print("[bold]Non-lazy switch[/] none in this release")


def _compile_settings(console: Console, facts: GuardsFacts) -> None:
    from rich.markup import escape

    settings = facts.get("compile_settings") or {}
    storage = settings.get("storage")
    if storage is None:
        return
    where = f" ({escape(str(settings['file']))}:{settings['write_line']})" if settings.get("write_line") else ""
    style = {"per-thread": "red", "process-wide": "green"}.get(storage, "magenta")
    console.print(f"[bold]Compile settings[/] [{style}]{escape(storage)}[/]{where}")
    for line in settings.get("consequences") or []:
        console.print(f"  - {escape(line)}")


def _state(console: Console, facts: GuardsFacts) -> None:
    from rich.markup import escape

    source = facts.get("state_source", "?")
    label = source if source.startswith("not read") else f"from {source}"
    console.print(f"\n[bold]State[/] [dim]({escape(label)})[/]")
    config = facts.get("config") or {}
    flag_now = facts.get("fx_flag_now")
    if any(value is not None for value in config.values()) or flag_now is not None:
        flag_text = "[bold red]True: this process is corrupted[/]" if flag_now else escape(str(flag_now))
        console.print("  " + "  ".join(f"{escape(k)}={escape(str(v))}" for k, v in config.items())
                      + f"  FX flag now={flag_text}")
    for label, cache in (("inductor cache", facts["compile_cache"]), ("triton cache", facts["triton_cache"])):
        if cache:
            console.print(f"  {label} {escape(cache['dir'])}: {escape(_cache_text(cache))}")
    seen = facts["env"]
    if seen is None:
        return
    env = {k: v for k, v in seen.items() if v is not None}
    console.print("  env: " + (escape("  ".join(f"{k}={v}" for k, v in env.items())) if env
                               else "[dim]none of the relevant variables is set[/]"))


def _cache_text(cache: dict) -> str:
    if not cache.get("exists"):
        return "absent (cold)"
    if not cache.get("entries"):
        return "empty (cold)"
    more = "+" if cache.get("truncated") else ""
    return f"{cache['bytes'] / 1e6:.1f} MB in {cache['entries']}{more} files"


def _probes(console: Console, facts: GuardsFacts) -> None:
    from rich.markup import escape

    from dflash_doctor.render.tables import Column, fitted

    details = facts.get("probe_details") or {}
    if not details:
        return
    reasons = {detail.get("detail") for detail in details.values() if detail.get("outcome") == "skipped"}
    if len(reasons) == 1 and all(detail.get("outcome") == "skipped" for detail in details.values()):
        console.print(f"\n[bold]Probes[/] [dim]skipped: {escape(str(reasons.pop()))}[/]")
        return
    console.print("\n[bold]Probes[/] [dim](each in its own child process)[/]")
    columns = [Column("probe", wrap=False), Column("outcome", wrap=False), Column("took s", "right", wrap=False),
               Column("detail")]
    rows = []
    for name, detail in details.items():
        outcome = detail.get("outcome", "?")
        seconds = detail.get("seconds")
        rows.append([
            escape(name), f"[{_OUTCOME_STYLE.get(outcome, 'bold')}]{escape(outcome)}[/]",
            "-" if seconds is None else f"{seconds:.2f}",
            escape(str(detail.get("error") or detail.get("detail") or "")),
        ])
    console.print(fitted(console, columns, rows))


def _hazards(console: Console, facts: GuardsFacts) -> None:
    """One row per hazard: its verdict, the lines that decided it (relative to the torch folder), the probe that
    bore on it, and the registry's fixes for it on this release. The verdict's reasons follow in full."""
    import os

    from rich.markup import escape

    from dflash_doctor.render.tables import Column, fitted

    hazards = facts.get("hazards") or {}
    if not hazards:
        return
    root = str(facts.get("torch_root") or "")
    console.print("\n[bold]Hazards[/] [dim](decided from the source; probes where they ran)[/]")
    columns = [Column("hazard", wrap=False), Column("verdict", wrap=False), Column("decided by"),
               Column("probe", wrap=False), Column("fixes here")]
    rows = []
    for hazard in hazards.values():
        state = hazard.get("state", "?")
        cited = ", ".join(f"{os.path.relpath(c['file'], root) if root else c['file']}:{c['line']}"
                          for c in hazard.get("cited") or [])
        unavailable = hazard.get("unavailable") or {}
        fixes = ", ".join(hazard.get("fixes") or []) + "".join(
            f"; not {name}: {why}" for name, why in unavailable.items())
        rows.append([escape(hazard.get("title", "?")), f"[{_STATE_STYLE.get(state, 'bold')}]{escape(state)}[/]",
                     escape(cited or "-"), escape(hazard.get("probe") or "-"), escape(fixes or "-")])
    console.print(fitted(console, columns, rows))


def _fixes(console: Console, fixes: list) -> None:
    from rich.markup import escape

    if not fixes:
        return
    console.print("\n[bold]Fixes[/] (best first)")
    for fix in fixes:
        console.print(f"  {fix['rank']}. {escape(fix['fix'])}"
                      + (f"  [dim]({escape(fix['evidence_label'])})[/]" if fix.get("evidence_label") else ""))
        for api in fix.get("api") or []:
            console.print(f"     [cyan]{escape(api)}[/]")
        if fix.get("kind") == FixKind.MITIGATION and fix.get("gaps"):
            console.print(f"     [yellow]leaves open here: {escape(', '.join(fix['gaps']))}[/]")
        for caveat in fix.get("caveats") or []:
            console.print(f"     [dim]caveat: {escape(caveat)}[/]")
        console.print(f"     [dim]cost: {escape(fix['cost'])}[/]")
