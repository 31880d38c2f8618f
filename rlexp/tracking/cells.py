"""Text from a run folder written where another program interprets it: a spreadsheet, a markdown renderer, a
plot's text engine. Run names, configuration values and metric names are chosen by whoever made the runs (a
sweep someone mailed you), so each sink gets the value inert, not evaluated:

* `csv_cell`: a cell a spreadsheet would evaluate (OWASP's CSV injection list: a first character `=`, `+`,
  `-`, `@`, tab or carriage return, their full-width forms, also after leading blanks) gets a `'` in front, so
  `=HYPERLINK(...)` or `@SUM(...)` is shown, never run; a plain number (`-0.25`, `1e-05`) stays a number.
  `CSV_QUOTING` quotes every cell, so a reader splitting on `;` or tab (other locales) cannot cut a cell in
  two and start a formula mid-cell.
* `md_text`: markdown and HTML control characters escaped (`<script>` shows as text, `|` cannot open a table
  column, `[x](url)` and `![x](url)` make no link or image, backticks no code span) and line breaks and other
  control characters become blanks, so no value can start a line of its own (a heading, a table row, an
  escape sequence on a terminal).
* `plot_text`: `$` escaped, so matplotlib's mathtext never parses a label (a bad expression fails at save).
"""
from __future__ import annotations

import csv
import re

# OWASP "CSV Injection": cells starting with these are formulas to Excel, LibreOffice or Google Sheets.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")
CSV_QUOTING = csv.QUOTE_ALL
_PLAIN_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]")
_MD_SPECIAL = re.compile(r"([\\`|*\[\]])")


def csv_cell(value: object) -> str:
    """One CSV cell that a spreadsheet shows as the text it is."""
    s = "" if value is None else str(value)
    if _PLAIN_NUMBER.fullmatch(s):
        return s
    if s.lstrip(" \u3000").startswith(FORMULA_STARTS) or s.startswith(FORMULA_STARTS):
        return "'" + s
    return s


def csv_row(values: list[object]) -> list[str]:
    return [csv_cell(v) for v in values]


def md_text(value: object) -> str:
    """Text for a markdown table cell or sentence: rendered as itself, on one line."""
    s = _CONTROL.sub(" ", "" if value is None else str(value))
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", s)


def plot_text(value: object) -> str:
    """A label for matplotlib: never mathtext, on one line."""
    return _CONTROL.sub(" ", str(value)).replace("$", r"\$")
