"""Per-stream summary and hazard tables (text and HTML)."""

from __future__ import annotations

import html

from streampass.view.data import data

WAIT_OPS = {"wait_event", "wait_stream", "sync_dealloc"}
RECORD_OPS = {"record_event"}


def summary(dag) -> list[dict[str, int]]:
    """One row per stream: nodes, compute nodes, cross-stream data in/out, records, waits, hazards.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> summary(gm)[1]
    {'stream': 1, 'nodes': 1, 'compute': 1, 'cross_in': 1, 'cross_out': 1, 'records': 0, 'waits': 0, 'hazards': 1}
    """
    d = data(dag)
    rows = {
        s: {
            "stream": s,
            "nodes": 0,
            "compute": 0,
            "cross_in": 0,
            "cross_out": 0,
            "records": 0,
            "waits": 0,
            "hazards": 0,
        }
        for s in d.streams
    }
    for n in d.nodes:
        r = rows[n["stream"]]
        r["nodes"] += 1
        r["compute"] += n["role"] == "compute"
        r["records"] += n["sync"] in RECORD_OPS
        r["waits"] += n["sync"] in WAIT_OPS
    for u, v in d.cross_stream_edges():
        rows[d.stream_of(u)]["cross_out"] += 1
        rows[d.stream_of(v)]["cross_in"] += 1
    for h in d.hazards:
        rows[d.stream_of(h.nodes[-1])]["hazards"] += 1
    return [rows[s] for s in d.streams]


_SUMMARY_COLS = [
    ("stream", "stream"),
    ("nodes", "nodes"),
    ("compute", "compute"),
    ("cross_in", "cross-stream in"),
    ("cross_out", "cross-stream out"),
    ("records", "records"),
    ("waits", "waits"),
    ("hazards", "hazards"),
]


def summary_text(dag) -> str:
    """The per-stream summary (:func:`summary`) as an aligned plain-text table.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> print(summary_text(gm))
         stream  nodes  compute  cross-stream in  cross-stream out  records  waits  hazards
    0 (ambient)      4        2                1                 1        0      0        3
              1      1        1                1                 1        0      0        1
    """
    rows = summary(dag)
    head = [h for _, h in _SUMMARY_COLS]
    cells = [
        [str(r[k]) + (" (ambient)" if k == "stream" and r[k] == 0 else "") for k, _ in _SUMMARY_COLS] for r in rows
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *cells)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*c) for c in cells])


def summary_table(dag) -> str:
    """The per-stream summary as an HTML table.

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> html_ = summary_table(gm)
    >>> html_.startswith('<table class="sp-table">'), html_.count("<tr>")  # header + 2 streams
    (True, 3)
    >>> "<td>0 (ambient)</td>" in html_, '<td class="sp-bad">3</td>' in html_
    (True, True)
    """
    rows = summary(dag)
    out = ['<table class="sp-table"><thead><tr>']
    out += [f"<th>{html.escape(h)}</th>" for _, h in _SUMMARY_COLS]
    out.append("</tr></thead><tbody>")
    for r in rows:
        out.append("<tr>")
        for k, _ in _SUMMARY_COLS:
            v = r[k]
            text = f"{v} (ambient)" if k == "stream" and v == 0 else str(v)
            cls = ' class="sp-bad"' if k == "hazards" and v else ""
            out.append(f"<td{cls}>{text}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def hazard_table(hazards, limit: int = 50) -> str:
    """Hazards as an HTML table (kind, nodes, message).

    >>> import torch, streampass as sp
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> def f(x):
    ...     with sp.stream(1):
    ...         y = x.sin()
    ...     return y + x.cos()
    >>> gm = make_fx(f)(torch.ones(4))
    >>> hazards = sp.verify(gm).hazards
    >>> table = hazard_table(hazards)
    >>> table.count('<td class="sp-bad">'), "<code>sin → add</code>" in table
    (4, True)
    >>> hazard_table(hazards, limit=1).endswith("<p>… 3 more</p>")
    True
    >>> hazard_table([])
    '<p class="sp-ok">no hazards</p>'
    """
    hazards = list(hazards)
    if not hazards:
        return '<p class="sp-ok">no hazards</p>'
    out = [
        '<table class="sp-table sp-hazards"><thead><tr><th>kind</th><th>nodes</th><th>what can go wrong</th></tr></thead><tbody>'
    ]
    for h in hazards[:limit]:
        out.append(
            f'<tr><td class="sp-bad">{html.escape(h.kind)}</td><td><code>{html.escape(" → ".join(h.nodes))}</code></td>'
            f"<td>{html.escape(h.message)}</td></tr>"
        )
    out.append("</tbody></table>")
    if len(hazards) > limit:
        out.append(f"<p>… {len(hazards) - limit} more</p>")
    return "".join(out)
