"""Charts as inline SVG, drawn on the server (no script, no library, nothing fetched).

Colours are SVG presentation attributes (the pages' Content-Security-Policy allows no inline
style). Markup is built from constant templates with `Markup.format`, which escapes every
argument: labels (team, pool and job names) cannot inject markup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from markupsafe import Markup

from broker.domain.units import approx_duration as human

PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac")
PHASE_COLOURS = {"queued": "#bab0ac", "dispatch": "#76b7b2", "scheduling": "#edc948",
                 "init": "#f28e2b", "warm-up": "#b07aa1", "running": "#59a14f"}
NO_PHASES = Markup('<p class="muted">no phases yet</p>')
NO_DATA = Markup('<p class="muted">no data in this range</p>')
END = Markup("</svg>")


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _open(label: str, width: int, height: int) -> Markup:
    return Markup('<svg class="chart" role="img" aria-label="{}" width="{}" height="{}" '
                  'viewBox="0 0 {} {}">').format(label, width, height, width, height)


def _t(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _rows(attempts: Sequence[Mapping[str, object]], now: datetime
          ) -> list[tuple[str, str, datetime, datetime, float, bool]]:
    rows = []
    for a in attempts:
        for p in a["phases"]:  # type: ignore[attr-defined]
            start, end = _t(p["start"]), _t(p["end"])
            if start is not None:
                rows.append((f"#{a['number']} {p['name']}", str(p["name"]), start, end or now,
                             float(p["seconds"]), end is None))
    return rows


def timeline(attempts: Sequence[Mapping[str, object]], now: str, width: int = 720) -> Markup:
    """One row per phase of each attempt (the dicts of GET /v1/jobs/{id}/timeline), bars on
    one time axis spanning the job."""
    rows = _rows(attempts, datetime.fromisoformat(now))
    if not rows:
        return NO_PHASES
    t0 = min(r[2] for r in rows)
    span = max(1.0, (max(r[3] for r in rows) - t0).total_seconds())
    left, bar_w, h = 130, width - 130 - 80, 18
    parts = [_open("timeline", width, len(rows) * h + 4)]
    for i, (label, name, start, end, secs, live) in enumerate(rows):
        x = left + (start - t0).total_seconds() / span * bar_w
        w = max(2.0, (end - start).total_seconds() / span * bar_w)
        y = i * h + 2
        text = human(secs) + (" (now)" if live else "")
        parts.append(Markup(
            '<text x="0" y="{}">{}</text><rect x="{:.1f}" y="{}" width="{:.1f}" height="{}" '
            'fill="{}"><title>{}: {}</title></rect><text x="{:.1f}" y="{}">{}</text>'
        ).format(y + 13, label, x, y, w, h - 4, PHASE_COLOURS.get(name, "#999"), name, text,
                 min(x + w + 4, width - 76), y + 13, text))
    parts.append(END)
    return Markup("").join(parts)


def stacked_bars(columns: Sequence[str], series: Mapping[str, Sequence[float]],
                 unit: str = "", width: int = 720, height: int = 220) -> Markup:
    """One bar per column, stacked by series (e.g. time buckets x teams), with a legend."""
    if not columns or not any(v for vals in series.values() for v in vals):
        return NO_DATA
    top = max(sum(vals[i] for vals in series.values()) for i in range(len(columns))) or 1.0
    left, bottom, legend_h = 56, 36, 18 * ((len(series) + 3) // 4)
    plot_h, step = height - bottom - 8, (width - left - 8) / len(columns)
    bar = max(2.0, step * 0.7)
    parts = [_open("chart", width, height + legend_h), Markup(
        '<text x="0" y="12">{}{}</text><text x="0" y="{}">0</text>'
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#888"/>'
    ).format(_num(top), unit, plot_h + 8, left, plot_h + 8, width - 8, plot_h + 8)]
    every = max(1, len(columns) // 12)
    for i, col in enumerate(columns):
        x, y = left + i * step, float(plot_h + 8)
        for k, (name, vals) in enumerate(series.items()):
            bh = vals[i] / top * plot_h
            if bh <= 0:
                continue
            y -= bh
            parts.append(Markup(
                '<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="{}">'
                '<title>{} {}: {}{}</title></rect>'
            ).format(x, y, bar, bh, colour(k), col, name, _num(vals[i]), unit))
        if i % every == 0:
            parts.append(Markup('<text x="{:.1f}" y="{}">{}</text>').format(x, plot_h + 24, col))
    for k, name in enumerate(series):
        lx, ly = 8 + (k % 4) * ((width - 16) / 4), height + 4 + (k // 4) * 18
        parts.append(Markup(
            '<rect x="{:.0f}" y="{}" width="10" height="10" fill="{}"/>'
            '<text x="{:.0f}" y="{}">{}</text>'
        ).format(lx, ly, colour(k), lx + 14, ly + 10, name))
    parts.append(END)
    return Markup("").join(parts)


def meter(used: float, nominal: float, limit: float, width: int = 160) -> Markup:
    """A usage bar: used against nominal (the tick), scaled to nominal + borrowing limit."""
    full = max(limit, nominal, used, 1.0)
    fill = "#e15759" if used > nominal else "#59a14f"
    return Markup(
        '<svg class="meter" role="img" aria-label="{} of {}" width="{}" height="14" '
        'viewBox="0 0 {} 14"><rect x="0" y="2" width="{}" height="10" fill="#eee"/>'
        '<rect x="0" y="2" width="{:.1f}" height="10" fill="{}"/>'
        '<line x1="{:.1f}" y1="0" x2="{:.1f}" y2="14" stroke="#333"/></svg>'
    ).format(_num(used), _num(nominal), width, width, width, min(used, full) / full * width,
             fill, nominal / full * width, nominal / full * width)


def _num(v: float) -> str:
    """12,345 / 12.3 / 0.042: a few significant digits, whatever the scale."""
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 1 or v == 0:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.2g}"
