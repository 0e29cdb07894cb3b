"""Tiny HTML/Markdown builders shared by the run and sweep reports. Every piece of text that
came from a run (model outputs included) is escaped: a report must never execute what it shows."""
from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Iterable, List, Sequence

import pandas as pd

from analysis.tables import display, to_markdown

STYLE = """
body { font-family: -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1100px;
       color: #222; line-height: 1.4; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: .85em; margin: .5em 0; }
th, td { border: 1px solid #ccc; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
img { max-width: 100%; border: 1px solid #eee; }
pre { background: #f8f8f8; padding: .4em; white-space: pre-wrap; font-size: .85em; margin: 0; }
.state-finished { color: #1a7f37; } .state-stopped_early { color: #bf8700; } .state-failed { color: #cf222e; }
.muted { color: #777; }
"""


def esc(value) -> str:
    return html.escape("" if value is None else str(value))


def page(title: str, body: Iterable[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def image(path: Path, alt: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f'<img src="data:image/png;base64,{data}" alt="{esc(alt)}">'


def table(frame: pd.DataFrame, links: dict | None = None) -> str:
    """An escaped HTML table, numbers formatted as in every report (analysis/tables.py); `links`
    maps a cell text to an href."""
    links = links or {}
    head = "".join(f"<th>{esc(c)}</th>" for c in frame.columns)
    rows = []
    for _, row in display(frame).iterrows():
        cells = []
        for text in row:
            cell = f'<a href="{esc(links[text])}">{esc(text)}</a>' if text in links else esc(text)
            cells.append(f"<td>{cell}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def md_table(frame: pd.DataFrame) -> str:
    return to_markdown(frame)


def md_code(text: str) -> str:
    fence = "````" if "```" in text else "```"
    return f"{fence}\n{text}\n{fence}"


def kv_table(pairs: Sequence[tuple]) -> str:
    return "<table>" + "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in pairs) + "</table>"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


__all__: List[str] = ["esc", "page", "image", "table", "md_table", "md_code", "kv_table", "write"]
