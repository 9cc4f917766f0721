"""HTML helpers shared by the views, the report and the comparison."""

from __future__ import annotations

import re

from streampass.view.style import CROSS_COLOUR, DATA_COLOUR, HAZARD_COLOUR, SYNC_COLOUR

CSS = """
.sp-root{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;font-size:13px;color:#222}
.sp-root table.sp-table{border-collapse:collapse;margin:6px 0}
.sp-root .sp-table th,.sp-root .sp-table td{border:1px solid #ccc;padding:2px 8px;text-align:left !important;vertical-align:top}
.sp-root .sp-table th{background:#f0f0f0}
.sp-root .sp-bad{color:#d62728;font-weight:600}
.sp-root .sp-ok{color:#2a8a2a;font-weight:600}
.sp-root .sp-note{color:#555;font-size:12px;margin:4px 0}
.sp-root .sp-svg{overflow:auto;max-height:720px;border:1px solid #e4e4e4;background:#fff}
.sp-root .sp-svg svg{max-width:100%;height:auto}
.sp-root .sp-wide svg{max-width:none}
.sp-root .sp-legend span{display:inline-block;margin-right:14px;font-size:12px}
.sp-root .sp-sw{display:inline-block;width:22px;height:0;vertical-align:middle;margin-right:4px;border-top:2px solid}
"""


def legend_html() -> str:
    """The HTML legend of the drawings' edge styles (data, cross-stream, sync, hazard).

    >>> legend = legend_html()
    >>> legend.startswith('<div class="sp-legend">'), legend.count("<span>")
    (True, 4)
    >>> "record → wait (sync)" in legend, "border-top:2px dashed #8a3ab9" in legend
    (True, True)
    """
    items = [
        (f"border-top:2px solid {DATA_COLOUR}", "data"),
        (f"border-top:2px solid {CROSS_COLOUR}", "cross-stream data"),
        (f"border-top:2px dashed {SYNC_COLOUR}", "record → wait (sync)"),
        (f"border-top:2px solid {HAZARD_COLOUR}", "hazard (hover for why)"),
    ]
    return (
        '<div class="sp-legend">'
        + "".join(f'<span><i class="sp-sw" style="{s}"></i>{t}</span>' for s, t in items)
        + "</div>"
    )


def wrap_page(body: str) -> str:
    return f'<div class="sp-root"><style>{CSS}</style>{body}</div>'


_SVG_PROLOGUE = re.compile(r"^\s*(<\?xml[^>]*\?>\s*)?(<!DOCTYPE[^>]*>\s*)?(<!--.*?-->\s*)*", re.S)


def inline_svg(svg: str) -> str:
    """An SVG document with its XML prologue stripped, to embed in HTML.

    >>> inline_svg('<?xml version="1.0"?><!DOCTYPE svg><!-- made by dot --><svg/>')
    '<svg/>'
    """
    return _SVG_PROLOGUE.sub("", svg, count=1)


_WIDTH = re.compile(r'<svg[^>]*?\swidth="([\d.]+)(?:pt|px)?"')
#: A drawing wider than this (pt) keeps its own size in its box and scrolls: scaled to the
#: page (about 1000pt), its 11pt labels would shrink below about 3pt (the demo's, 3100pt wide, fits).
SCROLL_ABOVE_PT = 4000


def svg_block(svg: str) -> str:
    """An SVG drawing in its scrolling box, scaled down to the page's width unless that would
    make its text unreadable: then at its own size.

    >>> svg_block('<svg width="300pt" height="90pt"/>')
    '<div class="sp-svg"><svg width="300pt" height="90pt"/></div>'
    >>> svg_block('<svg width="9000pt" height="90pt"/>')
    '<div class="sp-svg sp-wide"><svg width="9000pt" height="90pt"/></div>'
    """
    body = inline_svg(svg)
    m = _WIDTH.search(body)
    wide = m is not None and float(m.group(1)) > SCROLL_ABOVE_PT
    return f'<div class="sp-svg{" sp-wide" if wide else ""}">{body}</div>'
