"""Charts as inline SVG, drawn on the server (no script, no library, nothing fetched).

Colours are SVG presentation attributes and CSS classes (the pages' Content-Security-Policy
allows no inline style). Every label is escaped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from markupsafe import Markup, escape

from broker.timeline import human

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")
PHASE_COLOURS = {"queued": "#bab0ac", "dispatch": "#76b7b2", "scheduling": "#edc948",
                 "init": "#f28e2b", "warm-up": "#b07aa1", "running": "#59a14f"}


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _t(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def timeline(attempts: Sequence[Mapping[str, object]], now: str, width: int = 720) -> Markup:
    """One row per phase of each attempt (the dicts of GET /v1/jobs/{id}/timeline), bars on
    one time axis spanning the job."""
    rows: list[tuple[str, str, datetime, datetime, float, bool]] = []
    end_now = datetime.fromisoformat(now)
    for a in attempts:
        for p in a["phases"]:  # type: ignore[attr-defined]
            start, end = _t(p["start"]), _t(p["end"])
            assert start is not None
            rows.append((f"#{a['number']} {p['name']}", p["name"], start, end or end_now,
                         float(p["seconds"]), end is None))
    if not rows:
        return Markup('<p class="muted">no phases yet</p>')
    t0 = min(r[2] for r in rows)
    span = max(1.0, (max(r[3] for r in rows) - t0).total_seconds())
    left, bar_w, h = 130, width - 130 - 80, 18
    parts = [f'<svg class="chart" role="img" aria-label="timeline" width="{width}" '
             f'height="{len(rows) * h + 4}" viewBox="0 0 {width} {len(rows) * h + 4}">']
    for i, (label, name, start, end, secs, live) in enumerate(rows):
        x = left + (start - t0).total_seconds() / span * bar_w
        w = max(2.0, (end - start).total_seconds() / span * bar_w)
        y = i * h + 2
        fill = PHASE_COLOURS.get(name, "#999")
        text = human(secs) + (" (now)" if live else "")
        parts.append(
            f'<text x="0" y="{y + 13}">{escape(label)}</text>'
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{h - 4}" fill="{fill}">'
            f'<title>{escape(name)}: {escape(text)}</title></rect>'
            f'<text x="{min(x + w + 4, width - 76):.1f}" y="{y + 13}">{escape(text)}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def stacked_bars(columns: Sequence[str], series: Mapping[str, Sequence[float]],
                 unit: str = "", width: int = 720, height: int = 220) -> Markup:
    """One bar per column, stacked by series (e.g. days x teams), with a legend."""
    if not columns or not series:
        return Markup('<p class="muted">no data in this range</p>')
    totals = [sum(vals[i] for vals in series.values()) for i in range(len(columns))]
    top = max(totals) or 1.0
    left, bottom, legend_h = 56, 36, 18 * ((len(series) + 3) // 4)
    plot_h = height - bottom - 8
    step = (width - left - 8) / len(columns)
    bar = max(2.0, step * 0.7)
    parts = [f'<svg class="chart" role="img" aria-label="chart" width="{width}" '
             f'height="{height + legend_h}" viewBox="0 0 {width} {height + legend_h}">',
             f'<text x="0" y="12">{_num(top)}{escape(unit)}</text>',
             f'<text x="0" y="{plot_h + 8}">0</text>',
             f'<line x1="{left}" y1="{plot_h + 8}" x2="{width - 8}" y2="{plot_h + 8}" '
             'stroke="#888"/>']
    every = max(1, len(columns) // 12)
    for i, col in enumerate(columns):
        x, y = left + i * step, plot_h + 8
        for k, (name, vals) in enumerate(series.items()):
            bh = vals[i] / top * plot_h
            if bh <= 0:
                continue
            y -= bh
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{bh:.1f}" '
                         f'fill="{colour(k)}"><title>{escape(col)} {escape(name)}: '
                         f'{_num(vals[i])}{escape(unit)}</title></rect>')
        if i % every == 0:
            parts.append(f'<text x="{x:.1f}" y="{plot_h + 24}">{escape(col)}</text>')
    for k, name in enumerate(series):
        lx, ly = 8 + (k % 4) * ((width - 16) / 4), height + 4 + (k // 4) * 18
        parts.append(f'<rect x="{lx:.0f}" y="{ly}" width="10" height="10" fill="{colour(k)}"/>'
                     f'<text x="{lx + 14:.0f}" y="{ly + 10}">{escape(name)}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def meter(used: float, nominal: float, limit: float, width: int = 160) -> Markup:
    """A usage bar: used against nominal (tick) and nominal + borrowing limit (full width)."""
    full = max(limit, nominal, used, 1.0)
    u = min(used, full) / full * width
    n = nominal / full * width
    over = "#e15759" if used > nominal else "#59a14f"
    return Markup(
        f'<svg class="meter" role="img" aria-label="{_num(used)} of {_num(nominal)}" '
        f'width="{width}" height="14" viewBox="0 0 {width} 14">'
        f'<rect x="0" y="2" width="{width}" height="10" fill="#eee"/>'
        f'<rect x="0" y="2" width="{u:.1f}" height="10" fill="{over}"/>'
        f'<line x1="{n:.1f}" y1="0" x2="{n:.1f}" y2="14" stroke="#333"/></svg>'
    )


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.1f}".rstrip("0").rstrip(".")
