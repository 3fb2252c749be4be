"""Tables that fit: every view's table goes through `fitted`, which picks a layout that keeps every column whole.

rich squeezes a table that is wider than the console: a column can shrink to two characters (thirty lines a
cell), or vanish. Here a table is drawn only where it fits:

- as it is, when every cell fits on one line at the console's width (a terminal, a file, a pipe alike);
- on a terminal, with long cells wrapped at spaces, when each wrapping column can still get its `min_width`
  and its longest word (so no word is cut and no column becomes unreadable);
- otherwise as a list: one block per row, its first cell as the block's heading and every other cell as
  `header: value` under it. Nothing is dropped; an empty cell is left out of its block.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass
from typing import List, Sequence

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

COLUMN_GAP = 2  # the blank columns between two cells
WRAPPED_MIN = 12  # a wrapping column narrower than this is no longer readable


@dataclass(frozen=True)
class Column:
    header: str
    justify: str = "left"
    wrap: bool = True  # False: its cells stay whole (a GPU index, a bar); the layout gives way instead
    min_width: int = WRAPPED_MIN


def _width(console: Console, markup: str) -> int:
    return console.render_str(markup).cell_len


def _longest_word(console: Console, markup: str) -> int:
    return max((len(word) for word in console.render_str(markup).plain.split()), default=0)


def layout(console: Console, columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> str:
    """`table`, `wrapped` or `list`: what `fitted` draws at this console's width."""
    if not rows:
        return "table"
    gaps = COLUMN_GAP * (len(columns) - 1)
    natural = [max([_width(console, column.header)] + [_width(console, row[i]) for row in rows])
               for i, column in enumerate(columns)]
    if sum(natural) + gaps <= console.width:
        return "table"
    if not console.is_terminal:  # a file or a pipe: wrapped cells would interleave with their neighbours' lines
        return "list"
    least = [natural[i] if not column.wrap else min(natural[i], max(
        column.min_width, _width(console, column.header), *(_longest_word(console, row[i]) for row in rows)))
        for i, column in enumerate(columns)]
    return "wrapped" if sum(least) + gaps <= console.width else "list"


def fitted(console: Console, columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> RenderableType:
    """A renderable for `rows` (cells are rich markup, already escaped) laid out by `layout`."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    chosen = layout(console, columns, rows)
    if chosen == "list":
        lines: List[Text] = []
        for row in rows:
            lines.append(Text.from_markup(row[0] or "-", style="bold"))
            for column, cell in zip(columns[1:], row[1:]):
                if console.render_str(cell).plain.strip():
                    line = Text(f"  {column.header}: ", style="dim")
                    line.append_text(Text.from_markup(cell))
                    lines.append(line)
        return Group(*lines)
    # pad_edge off: one blank each side of a cell, none outside the first and last, so gaps are COLUMN_GAP
    table = Table(box=None, show_header=True, header_style="bold", pad_edge=False, padding=(0, COLUMN_GAP // 2))
    for column in columns:
        wraps = chosen == "wrapped" and column.wrap
        table.add_column(column.header, justify=column.justify, no_wrap=not wraps, overflow="fold",  # type: ignore[arg-type]
                         min_width=column.min_width if wraps else None)
    for row in rows:
        table.add_row(*row)
    return table
