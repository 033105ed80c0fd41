"""`jobgen report --html FILE`: one self-contained page (inline SVG and CSS, no script, nothing
fetched) with the account, the timeline and the curves."""
from __future__ import annotations

from html import escape
from pathlib import Path

from ..plumbing import fsio
from . import svg, text
from .report import Report

STYLE = ("body{font-family:sans-serif;margin:24px auto;padding:0 16px;max-width:1000px}"
         "pre{background:#f6f6f6;padding:12px;font-size:min(12px,1.3vw);white-space:pre-wrap;"
         "overflow-wrap:anywhere}"
         "h2{font-size:16px;margin-top:28px}svg{display:block;height:auto}"
         ".legend{list-style:none;padding:0;margin:6px 0 12px;display:flex;flex-wrap:wrap;"
         "gap:4px 16px;font-size:12px}.legend li{display:flex;align-items:center}"
         ".sw{display:inline-block;width:12px;height:12px;margin-right:5px;"
         "border:1px solid #999}"
         ".ln{display:inline-block;width:18px;height:0;margin-right:5px}")


def page(r: Report) -> str:
    timeline, *charts = svg.picture(r)
    if r.evals:   # beside the loss curve: the scores of the steps it led to
        axis = "tokens trained" if svg.eval_axis(r) == "tokens" else "step"
        charts[1:1] = [f"<p>lm-eval's scores of the exported steps ({len(r.evals)} "
                       f"evaluated): each task's headline metric against {axis}</p>",
                       svg.eval_legend(r), *svg.eval_charts(r)]
    account = text.text(r.timeline, r.account, r.curves, r.name, r.evals, r.exports)
    body = [f"<h1>jobgen report: {escape(r.name)}</h1>",
            f"<p>effective utilisation <b>{100 * r.account.utilisation:.2f} %</b> of "
            f"{r.account.allocated_h:.3f} allocated node-hours</p>",
            "<h2>timeline (one row per allocation and node, each with its own phases)</h2>",
            timeline or "<p>no allocation logs</p>",
            svg.timeline_legend(r) if timeline else "",
            "<h2>curves</h2>",
            svg.curves_legend(r),
            *charts,
            "<h2>account</h2>",
            f"<pre>{escape(account)}</pre>"]
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><meta name=\"viewport\" "
            "content=\"width=device-width\"><title>jobgen report "
            f"{escape(r.name)}</title><style>{STYLE}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")


def write(r: Report, path: Path) -> None:
    """Write the page through the one writer (a new temporary file beside it, then a rename;
    a symlink, FIFO or device given as the output is refused, not followed or replaced)."""
    fsio.write_or_refuse(path, page(r), "--html")
