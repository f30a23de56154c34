"""The one table printer: a table prints at its own width, whatever the terminal, with nothing trailing."""

from __future__ import annotations

import io

from forgerl import printer

WIDE = [["a-session-id-that-is-long-" + "x" * 40, 12345, "0.500", "a note with spaces in it " * 3]]


def test_a_wide_table_is_not_wrapped_to_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")  # what rich would otherwise squeeze a table to
    rendered = printer.text(printer.table(["session", "n", "reward", "note"], WIDE, left={"session", "note"},
                                          title="a title longer than forty characters, on one line",
                                          caption="rule one: longer than forty characters as well\nrule two"))
    lines = rendered.splitlines()
    assert lines[0] == "a title longer than forty characters, on one line"
    assert lines[1].split() == ["session", "n", "reward", "note"] and set(lines[2]) == {"─"}
    assert lines[3].split()[:3] == [WIDE[0][0], "12345", "0.500"] and lines[3].endswith(WIDE[0][3].rstrip())
    assert lines[4:] == ["rule one: longer than forty characters as well", "rule two"]
    assert all(line == line.rstrip() for line in lines)


def test_names_left_numbers_right_and_markdown_for_benches():
    rendered = printer.text(printer.table(["name", "ratio"], [["a", "1.5"], ["longer", "10.25"]], title="title",
                                          caption="a note", style=printer.MARKDOWN))
    assert rendered.splitlines() == ["title", "", "| name   | ratio |", "|--------|------:|", "| a      |   1.5 |",
                                     "| longer | 10.25 |", "", "a note"]  # a line right under would be a row


def test_show_prints_the_text():
    table = printer.table(["a"], [[1]])
    out = io.StringIO()
    printer.show(table, out)
    assert out.getvalue() == printer.text(table) + "\n" == "a\n─\n1\n"
