"""A Bundle as one Markdown or HTML document for an issue tracker.

The bundle is first laid out as a list of blocks (heading, paragraph, table, code, details), then written in
either format, so both always carry the same content. Every block is redacted before it is written (and the
Markdown once more as a whole): a token in a path, a log tail or a repro's stderr never survives either. Control
characters (a file name with an escape sequence) are spelled out, as on every terminal output.
"""
from __future__ import annotations

import enum
import html
import json
import re
from dataclasses import dataclass
from typing import List, Optional, Sequence

from dflash_doctor import TOOL_NAME
from dflash_doctor.printable import printable
from dflash_doctor.report.bundle import Bundle
from dflash_doctor.report.redact import redact_data, redact_text

MAX_SECTION_CHARS = 6000  # per section; a bug report nobody can scroll through is not read


class BlockKind(enum.Enum):
    """What a block of the document is; the Markdown and the HTML writer each draw every kind."""

    HEADING = enum.auto()
    PARAGRAPH = enum.auto()
    TABLE = enum.auto()
    CODE = enum.auto()
    DETAILS = enum.auto()  # a folded section: header[0] its summary, text the JSON inside


@dataclass(frozen=True)
class Block:
    kind: BlockKind
    text: str = ""
    rows: Sequence[Sequence[object]] = ()
    header: Sequence[str] = ()
    level: int = 2


def _json_text(data: object) -> str:
    # Structured first (a key that says secret hides its value), then as text with every block.
    text = json.dumps(redact_data(json.loads(json.dumps(data, default=str))), indent=2, sort_keys=True)
    if len(text) > MAX_SECTION_CHARS:
        text = text[:MAX_SECTION_CHARS] + f"\n... ({len(text) - MAX_SECTION_CHARS} more characters cut)"
    return text


def _findings_table(findings: list) -> Block:
    rows = []
    for f in findings:
        where = f"{f.get('path')}:{f.get('line')}" if f.get("path") else "environment"
        rows.append([f.get("code"), f.get("severity"), where, f.get("message")])
    return Block(BlockKind.TABLE, header=("code", "severity", "where", "message"), rows=rows)


def _part_blocks(title: str, section: Optional[dict], missing: str, made: str) -> List[Block]:
    blocks = [Block(BlockKind.HEADING, title)]
    if section is None:
        return blocks + [Block(BlockKind.PARAGRAPH, missing)]
    blocks.append(Block(BlockKind.PARAGRAPH, made))
    blocks.append(Block(BlockKind.PARAGRAPH, f"Verdict: {section['verdict']} ({section['total']} finding(s))"))
    if section["findings"]:
        blocks.append(_findings_table(section["findings"]))
        if section["total"] > len(section["findings"]):
            more = section["total"] - len(section["findings"])
            blocks.append(Block(BlockKind.PARAGRAPH, f"... and {more} more; counts by code: {section['counts']}"))
    for problem in section["problems"]:
        blocks.append(Block(BlockKind.PARAGRAPH, f"Could not check {problem['subject']}: {problem['reason']}"))
    fixes = section["facts"].get("fixes") if isinstance(section["facts"], dict) else None
    if isinstance(fixes, list) and fixes and all(isinstance(f, dict) and "fix" in f for f in fixes):
        blocks.append(Block(BlockKind.TABLE, header=("fix", "cost"),
                            rows=[[f["fix"], f.get("cost", "")] for f in fixes]))
    return blocks + [Block(BlockKind.DETAILS, _json_text(section["facts"]), header=("facts",))]


def _gpu_blocks(section: Optional[dict], made: str) -> List[Block]:
    blocks = [Block(BlockKind.HEADING, "GPU snapshot")]
    if section is None:
        return blocks + [Block(BlockKind.PARAGRAPH, "not collected (see Problems)")]
    blocks.append(Block(BlockKind.PARAGRAPH, made))
    gpus = section.get("gpus") or []
    if not gpus:
        return blocks + [Block(BlockKind.PARAGRAPH, f"no GPU: {section.get('reason') or 'none visible'}")]
    header = list(dict.fromkeys(key for gpu in gpus for key in gpu))
    blocks.append(Block(BlockKind.TABLE, header=header, rows=[[gpu.get(k, "") for k in header] for gpu in gpus]))
    if section.get("findings"):
        blocks.append(_findings_table(section["findings"]))
    return blocks


def age(seconds: float) -> str:
    """How long before the report a result was made, in the largest unit that is at least one."""
    seconds = max(0, int(seconds))
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds} s"


def made_text(made: dict, when: str) -> str:
    return f"Made by `{made['command']}` on {made['host']} in {made['cwd']}, {when}."


def _repro_blocks(section: dict) -> List[Block]:
    blocks = [Block(BlockKind.HEADING, "Last repro")]
    result = section.get("result")
    if result is None:
        if section.get("undated"):
            return blocks + [Block(BlockKind.PARAGRAPH, f"{section['source']} not included: it does not say when, "
                                                        "where or by which command it was made (see Problems)")]
        return blocks + [Block(BlockKind.PARAGRAPH,
                               f"none found at {section['source']} (run `dflash-doctor repro` first)")]
    made = section["made"]
    blocks.append(Block(BlockKind.PARAGRAPH, made_text(made, f"finished {made['finished_at']} "
                                                             f"({age(section['age_s'])} before this report)")))
    blocks.append(Block(BlockKind.PARAGRAPH, f"Read from {section['source']}: exit code {result.get('exit_code')}"))
    if result.get("findings"):
        blocks.append(_findings_table(result["findings"]))
    return blocks + [Block(BlockKind.DETAILS, _json_text(result.get("facts", {})), header=("repro facts",))]


def _clean(text: str) -> str:
    # Redacted before any escaping: HTML entities would split a `password="..."` apart and hide it from the
    # patterns. Control characters are spelled out: the Markdown is often read on a terminal (stdout).
    return printable(redact_text(text), keep_newlines=True)


def _cleaned(block: Block) -> Block:
    return Block(
        block.kind,
        _clean(block.text),
        rows=[[_clean(str(cell)) for cell in row] for row in block.rows],
        header=[_clean(str(h)) for h in block.header],
        level=block.level,
    )


def layout(bundle: Bundle) -> List[Block]:
    return [_cleaned(block) for block in _layout(bundle)]


def _layout(bundle: Bundle) -> List[Block]:
    env = bundle.environment
    blocks = [
        Block(BlockKind.HEADING, f"{TOOL_NAME} report", level=1),
        Block(BlockKind.PARAGRAPH, f"Generated {bundle.created} by {TOOL_NAME} {bundle.tool_version}. Secrets in "
                                   "the environment are redacted; read it once before you post it."),
        Block(BlockKind.HEADING, "Environment"),
        Block(BlockKind.TABLE, header=("field", "value"), rows=[[key, env[key]] for key in (
            "command", "python", "implementation", "platform", "machine", "cpu_count", "executable")]),
        Block(BlockKind.TABLE, header=("package", "version"),
                    rows=[[name, version or "not installed"] for name, version in env["packages"].items()]),
    ]
    if env["env"]:
        blocks.append(Block(BlockKind.CODE, "\n".join(f"{k}={v}" for k, v in env["env"].items())))
    # The parts this report ran itself: each says so (a reader cannot tell them from a cached result otherwise).
    now = made_text(bundle.made, f"at {bundle.made['at']}, by this report")
    blocks += _part_blocks("Guards", bundle.guards, "not checked (see Problems)", now)
    blocks += _part_blocks("Scan", bundle.scan, "not scanned (see Problems)", now)
    if bundle.scan is not None:
        blocks.append(Block(BlockKind.PARAGRAPH, "Scanned: " + ", ".join(bundle.scan["paths"])))
    blocks += _gpu_blocks(bundle.gpus, now)
    blocks += _repro_blocks(bundle.repro or {"source": "(not looked up)", "result": None})
    if bundle.problems:
        blocks.append(Block(BlockKind.HEADING, "Problems"))
        blocks += [Block(BlockKind.PARAGRAPH,
                         f"Could not check {p.subject}: {p.reason}" + (f" ({p.hint})" if p.hint else ""))
                   for p in bundle.problems]
    return blocks


def _md_cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _fence(text: str) -> str:
    return "`" * max(3, max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)


def _markdown_block(block: Block) -> str:
    if block.kind is BlockKind.HEADING:
        return f"{'#' * block.level} {block.text}"
    if block.kind is BlockKind.PARAGRAPH:
        return block.text
    if block.kind is BlockKind.TABLE:
        lines = ["| " + " | ".join(block.header) + " |", "|" + "---|" * len(block.header)]
        return "\n".join(lines + ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows])
    fence = _fence(block.text)
    if block.kind is BlockKind.CODE:
        return f"{fence}\n{block.text}\n{fence}"
    summary = html.escape(block.header[0])  # BlockKind.DETAILS, the one kind left
    return f"<details><summary>{summary}</summary>\n\n{fence}json\n{block.text}\n{fence}\n\n</details>"


def _html_block(block: Block) -> str:
    e = html.escape
    if block.kind is BlockKind.HEADING:
        return f"<h{block.level}>{e(block.text)}</h{block.level}>"
    if block.kind is BlockKind.PARAGRAPH:
        return f"<p>{e(block.text)}</p>"
    if block.kind is BlockKind.TABLE:
        head = "".join(f"<th>{e(str(h))}</th>" for h in block.header)
        body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in block.rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    if block.kind is BlockKind.CODE:
        return f"<pre>{e(block.text)}</pre>"
    return f"<details><summary>{e(block.header[0])}</summary><pre>{e(block.text)}</pre></details>"


def render_markdown(bundle: Bundle) -> str:
    return redact_text("\n\n".join(_markdown_block(b) for b in layout(bundle)) + "\n")


_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse;margin:.5em 0}"
    "td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left;vertical-align:top}"
    "pre{background:#f6f8fa;padding:.5em;white-space:pre-wrap}"
)


def render_html(bundle: Bundle) -> str:
    body = "\n".join(_html_block(b) for b in layout(bundle))
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{TOOL_NAME} report</title>'
        f"<style>{_STYLE}</style></head>\n<body>\n{body}\n</body></html>\n"
    )
