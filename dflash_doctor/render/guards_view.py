"""Text view of `guards` facts: versions, the guard's source with the flag highlighted, state, caches, probes,
verdict and ranked fixes. Draws only what the facts hold; the findings follow it (render/text.py)."""
from __future__ import annotations

import textwrap

_VERDICT_STYLE = {"vulnerable": "bold red", "safe": "bold green", "unknown": "bold magenta"}
_OUTCOME_STYLE = {"reproduced": "red", "not-reproduced": "green", "skipped": "dim", "error": "magenta"}
HIGHLIGHT = "bold black on yellow"


def guards_view(console, facts: dict) -> None:
    from rich.markup import escape

    _versions(console, facts)
    _guard(console, facts)
    _state(console, facts)
    _probes(console, facts)
    verdict = facts.get("verdict", "unknown")
    console.print(f"\n[bold]Verdict[/] [{_VERDICT_STYLE.get(verdict, 'bold')}]{escape(verdict.upper())}[/]")
    for reason in facts.get("verdict_reasons", []):
        console.print(f"  - {escape(reason)}")
    fixes = facts.get("fixes") or []
    if fixes:
        console.print("\n[bold]Fixes[/] (best first)")
        for fix in fixes:
            console.print(f"  {fix['rank']}. {escape(fix['fix'])}")
            console.print(f"     [dim]cost: {escape(fix['cost'])}[/]")
    console.print()


def _versions(console, facts: dict) -> None:
    from rich.markup import escape

    versions = facts.get("versions") or {}
    gpus = versions.get("gpu_count")
    parts = [
        f"torch {versions.get('torch') or '?'} ({versions.get('torch_build', '?')} build)",
        f"Python {versions.get('python', '?')}",
        f"triton {versions.get('triton') or '-'}",
        f"transformers {versions.get('transformers') or '-'}",
        f"GPUs {'?' if gpus is None else gpus}",
    ]
    console.print("[bold]" + escape(" · ".join(parts)) + "[/]")
    console.print(f"[dim]read from {escape(str(facts.get('torch_root', '?')))}[/]")
    corroboration = facts.get("corroboration") or {}
    if corroboration.get("table_row") is not None:
        if corroboration.get("agrees"):
            console.print(f"[dim]FACTS table for {corroboration['release']}: agrees with what was read[/]")
        else:
            console.print(f"[yellow]FACTS table for {corroboration['release']} differs in "
                          f"{escape(', '.join(corroboration['differences']))}: the source read here decides[/]")


def _guard(console, facts: dict) -> None:
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


def _source(console, lines, token: str) -> None:
    for row in source_rows(lines, token):
        console.print(row)


def source_rows(lines, token: str) -> list:
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


def _state(console, facts: dict) -> None:
    from rich.markup import escape

    source = facts.get("state_source", "?")
    label = source if source.startswith("not read") else f"from {source}"
    console.print(f"\n[bold]State[/] [dim]({escape(label)})[/]")
    config = facts.get("config") or {}
    flag_now = facts.get("fx_flag_now")
    flag_text = "[bold red]True: this process is corrupted[/]" if flag_now else escape(str(flag_now))
    console.print("  " + "  ".join(f"{escape(k)}={escape(str(v))}" for k, v in config.items())
                  + f"  FX flag now={flag_text}")
    for label, key in (("inductor cache", "compile_cache"), ("triton cache", "triton_cache")):
        cache = facts.get(key)
        if cache:
            console.print(f"  {label} {escape(cache['dir'])}: {escape(_cache_text(cache))}")
    env = {k: v for k, v in (facts.get("env") or {}).items() if v is not None}
    console.print("  env: " + (escape("  ".join(f"{k}={v}" for k, v in env.items())) if env
                               else "[dim]none of the relevant variables is set[/]"))


def _cache_text(cache: dict) -> str:
    if not cache.get("exists"):
        return "absent (cold)"
    if not cache.get("entries"):
        return "empty (cold)"
    more = "+" if cache.get("truncated") else ""
    return f"{cache['bytes'] / 1e6:.1f} MB in {cache['entries']}{more} files"


def _probes(console, facts: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    details = facts.get("probe_details") or {}
    if not details:
        return
    reasons = {detail.get("detail") for detail in details.values() if detail.get("outcome") == "skipped"}
    if len(reasons) == 1 and all(detail.get("outcome") == "skipped" for detail in details.values()):
        console.print(f"\n[bold]Probes[/] [dim]skipped: {escape(str(reasons.pop()))}[/]")
        return
    console.print("\n[bold]Probes[/] [dim](each in its own child process)[/]")
    table = Table(box=None, show_header=True, header_style="bold", pad_edge=False, padding=(0, 2, 0, 2))
    for column in ("probe", "outcome", "seconds", "detail"):
        table.add_column(column, no_wrap=column != "detail", overflow="fold")
    for name, detail in details.items():
        outcome = detail.get("outcome", "?")
        seconds = detail.get("seconds")
        table.add_row(
            escape(name), f"[{_OUTCOME_STYLE.get(outcome, 'bold')}]{escape(outcome)}[/]",
            "-" if seconds is None else f"{seconds:.2f}",
            escape(str(detail.get("error") or detail.get("detail") or "")),
        )
    console.print(table)
