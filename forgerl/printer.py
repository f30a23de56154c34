"""Tables, printed one way: every verb's table and every bench's goes through `table` and `show`.

A table is a `rich` table at its own width (never squeezed or wrapped to a
terminal's, so a piped or copied table reads as on screen), as plain text
with no trailing blanks. Verbs print `PLAIN` tables: a rule under the
header and cells split by spaces, so a row still splits on whitespace.
Benches print `MARKDOWN` ones, which `bench/README.md` quotes as they come.
Like `errors.py` it lives in the top package and imports nothing of
forgerl, so every layer may use it.
"""

from __future__ import annotations

import copy
import io
import sys
from collections.abc import Collection, Iterable, Sequence
from typing import TextIO

from rich import box
from rich.console import Console
from rich.table import Table

PLAIN = box.SIMPLE_HEAD
MARKDOWN = box.MARKDOWN
_UNBOUNDED = 1_000_000  # a console this wide never narrows a table


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, title: str | None = None,
          caption: str | None = None, left: int | Collection[str] = 1, style: box.Box = PLAIN) -> Table:
    """A table whose names are left-aligned and numbers right-aligned: `left` gives the first so many
    columns, or the headers, that hold names.

    Cells are shown with `str`; `caption` goes under the table (notes, one per line).
    """
    plain = style is PLAIN  # cells two spaces apart, none before the first
    out = Table(title=title, caption=caption, box=style, show_edge=not plain, pad_edge=not plain,
                padding=(0, 1, 0, 0) if plain else (0, 1))
    for i, header in enumerate(headers):
        named = i < left if isinstance(left, int) else header in left
        out.add_column(header, justify="left" if named else "right", no_wrap=True)
    for row in rows:
        out.add_row(*(str(cell) for cell in row))
    return out


def text(rendered: Table) -> str:
    """The table as plain text at its own width: no colour, no trailing blanks.

    The title and caption are lines of their own above and below it, not
    wrapped to the table's width as rich would; around a markdown table, a
    blank line apart (a line right under one would read as another row).
    """
    body = copy.copy(rendered)
    body.title = body.caption = None
    width = Console(width=_UNBOUNDED).measure(body).maximum
    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None, highlight=False).print(body)
    table_lines = buffer.getvalue().splitlines()
    if body.box is MARKDOWN:  # rich draws every column's rule as "---"; markdown marks the right-aligned "--:"
        at = next(i for i, line in enumerate(table_lines) if line.startswith("|-"))
        rules = table_lines[at].split("|")[1:-1]
        table_lines[at] = "|".join(["", *(rule[:-1] + ":" if column.justify == "right" else rule
                                         for rule, column in zip(rules, body.columns)), ""])
    blocks = [[str(rendered.title or "")], table_lines, str(rendered.caption or "").splitlines()]
    kept = ["\n".join(line.rstrip() for line in block if line.strip()) for block in blocks]
    return ("\n\n" if body.box is MARKDOWN else "\n").join(block for block in kept if block)


def show(rendered: Table, file: TextIO | None = None) -> None:
    """Print the table (`text`) to `file`, stdout by default."""
    print(text(rendered), file=file or sys.stdout)
