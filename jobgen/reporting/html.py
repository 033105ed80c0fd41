"""`jobgen report --html FILE`: one self-contained page (inline SVG and CSS, no script, nothing
fetched) with the account, the timeline and the curves."""
from __future__ import annotations

from html import escape
from pathlib import Path

from ..errors import ConfigError
from . import svg, text
from .report import Report

STYLE = ("body{font-family:sans-serif;margin:24px;max-width:1000px}"
         "pre{background:#f6f6f6;padding:12px;font-size:12px;overflow-x:auto}"
         "h2{font-size:16px;margin-top:28px}")


def page(r: Report) -> str:
    timeline, *charts = svg.picture(r)
    body = [f"<h1>jobgen report: {escape(r.name)}</h1>",
            f"<p>effective utilisation <b>{100 * r.account.utilisation:.2f} %</b> of "
            f"{r.account.allocated_h:.3f} allocated node-hours</p>",
            "<h2>timeline (one row per allocation and node; x marks a node's failure)</h2>",
            timeline or "<p>no allocation logs</p>",
            "<h2>curves (dashed: an allocation resumed there; dots: watch's marks)</h2>",
            *charts,
            "<h2>account</h2>",
            f"<pre>{escape(text.text(r.timeline, r.account, r.curves, r.name))}</pre>"]
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>jobgen report "
            f"{escape(r.name)}</title><style>{STYLE}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")


def write(r: Report, path: Path) -> None:
    """Write the page atomically (a temporary file beside it, then a rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(page(r), encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"--html {path}: cannot write: {exc.strerror}") from None
