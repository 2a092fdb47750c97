#!/usr/bin/env python3
"""Hand-written SVG bar charts for docs/benchmarks.md (standard library only).

A chart is a title, one or more panels and a few lines of notes. A panel is a horizontal bar
chart on its own linear scale from zero: one labelled bar per value, the value written after the
bar with its unit, optional whiskers (a spread: interquartile range, min–max, criterion's
interval) and an optional target drawn as a dashed vertical line. The panels of a chart share the
label column, so their bars start at the same x.

scripts/bench_section_charts.py turns each section of docs/benchmarks.md into a chart, from the
section's own table.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from typing import List, Optional
from xml.sax.saxutils import escape, quoteattr

# Layout, in pixels. Text cannot be measured without a renderer, so widths come from a glyph
# width a little above the average of common sans-serif fonts: labels get more room than they
# need rather than overrunning the bars.
FONT_SIZE = 12
CHAR_WIDTH = 7.0
TITLE_CHAR_WIDTH = 9.8
MARGIN = 16
PLOT_WIDTH = 440
ROW_HEIGHT = 24
BAR_HEIGHT = 14
PANEL_GAP = 18
FONT_FAMILY = "system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif"

SERIES_COLORS = {"gpuvisor": "#2f6db5", "baseline": "#a3abb5"}
TARGET_COLOR = "#c0392b"
TEXT_COLOR = "#222"
MUTED_COLOR = "#666"
GRID_COLOR = "#e3e3e3"


@dataclass
class Bar:
    """One value: `low`/`high` are its whiskers (both or neither); `series` picks the colour
    (gpuvisor itself, or a baseline it is compared with); `text`, when given, is the whole value
    label, unit included (the figure as the page's table prints it), instead of `value` rounded."""

    label: str
    value: float
    low: Optional[float] = None
    high: Optional[float] = None
    series: str = "gpuvisor"
    text: Optional[str] = None

    def value_label(self, unit):
        if self.text is not None:
            return self.text
        return f"{fmt_number(self.value)}{'' if unit.startswith('%') else ' '}{unit}"


@dataclass
class Panel:
    """Bars on one scale. `unit` follows every value label ("ms", "%", "M lines/s")."""

    title: str
    unit: str
    bars: List[Bar]
    target: Optional[float] = None
    target_label: Optional[str] = None


@dataclass
class Chart:
    """What one SVG file shows."""

    title: str
    panels: List[Panel]
    notes: List[str] = field(default_factory=list)


def fmt_number(value):
    """Three significant figures or so, with thousands separators: 0.729, 62.2, 1.66, 7,773,451."""
    magnitude = abs(value)
    if magnitude == 0:
        return "0"
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def with_unit(value, unit):
    return Bar("", value).value_label(unit)


def nice_scale(largest):
    """(axis maximum, tick step) for values up to `largest`: a step of 1, 2, 2.5 or 5 times a
    power of ten giving at most about six ticks, and the first multiple of it at or above
    `largest`."""
    if largest <= 0:
        return 1.0, 0.2
    raw_step = largest / 5
    exponent = math.floor(math.log10(raw_step))
    step = next(m * 10.0**exponent for m in (1, 2, 2.5, 5, 10) if m * 10.0**exponent >= raw_step * (1 - 1e-9))
    # Rounding before ceil keeps 10.000000001 steps from adding an empty tick.
    return step * math.ceil(round(largest / step, 9)), step


def tick_label(value, step):
    mantissa = step / 10.0 ** math.floor(math.log10(step))
    # A step of 2.5 needs one more decimal than 1, 2 or 5 of the same power: 0.25, 2.5 (but 25).
    decimals = max(0, -math.floor(math.log10(step)) + (1 if abs(mantissa - 2.5) < 1e-9 else 0))
    return f"{value:,.{decimals}f}"


def text_width(text, char_width=CHAR_WIDTH):
    return len(text) * char_width


def _validate(panel):
    if not panel.bars:
        raise ValueError(f"panel {panel.title!r} has no bars")
    for bar in panel.bars:
        if bar.value < 0 or (bar.low is not None and bar.low < 0):
            raise ValueError(f"bar {bar.label!r} is {bar.value} (low {bar.low}): bars start at zero, "
                             "negative values cannot be drawn; chart the two sides of a difference instead")
        if (bar.low is None) != (bar.high is None):
            raise ValueError(f"bar {bar.label!r} has only one whisker end")


def _text(x, y, content, anchor="start", size=FONT_SIZE, color=TEXT_COLOR, extra=""):
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" '
            f'fill="{color}"{extra}>{escape(content)}</text>')


def render(chart):
    """The chart as a standalone SVG document (a string)."""
    for panel in chart.panels:
        _validate(panel)
    bars = [bar for panel in chart.panels for bar in panel.bars]
    label_width = max(80.0, max(text_width(bar.label) for bar in bars) + 12)
    value_width = max(text_width(bar.value_label(panel.unit))
                      for panel in chart.panels for bar in panel.bars) + 16
    plot_left = MARGIN + label_width
    plot_right = plot_left + PLOT_WIDTH
    heading_width = max([text_width(chart.title, TITLE_CHAR_WIDTH)] +
                        [text_width(panel.title, 8.2) for panel in chart.panels])
    width = math.ceil(max(plot_right + value_width + MARGIN, heading_width + 2 * MARGIN))
    body = []
    y = MARGIN + 16
    body.append(_text(MARGIN, y, chart.title, size=15, extra=' font-weight="bold" class="title"'))
    y += 14
    for panel in chart.panels:
        y = _render_panel(body, panel, y + PANEL_GAP, plot_left, plot_right, width)
    note_chars = max(40, int((width - 2 * MARGIN) / 6.0))
    if chart.notes:
        y += 8
    for note in chart.notes:
        for line in textwrap.wrap(note, note_chars):
            y += 15
            body.append(_text(MARGIN, y, line, size=11, color=MUTED_COLOR, extra=' class="note"'))
    height = math.ceil(y + MARGIN)
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="{FONT_FAMILY}" role="img">',
        f"<title>{escape(chart.title)}</title>",
        # An opaque background keeps the dark text readable on dark page themes.
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>',
        *body,
        "</svg>",
        "",
    ])


def _render_panel(body, panel, y, plot_left, plot_right, width):
    """Appends one panel's elements from `y` down; returns the y below it."""
    largest = max([bar.high if bar.high is not None else bar.value for bar in panel.bars] +
                  [bar.value for bar in panel.bars] + ([panel.target] if panel.target is not None else []))
    axis_max, step = nice_scale(largest)
    scale = (plot_right - plot_left) / axis_max

    def x_of(value):
        return plot_left + value * scale

    body.append(_text(MARGIN, y, panel.title, size=13, extra=' font-weight="bold" class="panel-title"'))
    y += 8
    target_top = y
    if panel.target is not None:
        label = panel.target_label or f"target {with_unit(panel.target, panel.unit)}"
        x = x_of(panel.target)
        half = text_width(label) / 2
        # Centred over the line unless that would leave the picture.
        anchor, at = "middle", x
        if x + half > width - MARGIN:
            anchor, at = "end", x + 4
        elif x - half < MARGIN:
            anchor, at = "start", x - 4
        y += 14
        body.append(_text(at, y, label, anchor=anchor, size=11, color=TARGET_COLOR, extra=' class="target-label"'))
        target_top = y + 3
    y += 6
    top = y
    bottom = top + ROW_HEIGHT * len(panel.bars)
    ticks = [index * step for index in range(int(round(axis_max / step)) + 1)]
    for tick in ticks:
        x = x_of(tick)
        body.append(f'<line class="grid" x1="{x:.2f}" y1="{top}" x2="{x:.2f}" y2="{bottom}" '
                    f'stroke="{GRID_COLOR}" stroke-width="1"/>')
        body.append(_text(x, bottom + 14, tick_label(tick, step), anchor="middle", size=10,
                          color=MUTED_COLOR, extra=f' class="tick" data-value="{tick!r}"'))
    labels = []
    for index, bar in enumerate(panel.bars):
        row = top + index * ROW_HEIGHT
        middle = row + ROW_HEIGHT / 2
        color = SERIES_COLORS.get(bar.series, SERIES_COLORS["baseline"])
        body.append(_text(plot_left - 8, middle + 4, bar.label, anchor="end", extra=' class="label"'))
        body.append(f'<rect class="bar" x="{plot_left:.2f}" y="{middle - BAR_HEIGHT / 2:.2f}" '
                    f'width="{bar.value * scale:.3f}" height="{BAR_HEIGHT}" fill="{color}">'
                    f"<title>{escape(bar.label)}: {escape(bar.value_label(panel.unit))}</title></rect>")
        end = x_of(bar.value)
        if bar.low is not None:
            low, high = x_of(bar.low), x_of(bar.high)
            body.append(f'<path class="whisker" d="M{low:.3f},{middle:.2f} H{high:.3f} '
                        f'M{low:.3f},{middle - 5:.2f} V{middle + 5:.2f} M{high:.3f},{middle - 5:.2f} V{middle + 5:.2f}" '
                        f'stroke="{TEXT_COLOR}" stroke-width="1.2" fill="none"/>')
            end = max(end, high)
        # Drawn last, with a white halo, so a target line or whisker never hides them.
        labels.append(_text(end + 6, middle + 4, bar.value_label(panel.unit),
                            extra=' class="value" stroke="#fff" stroke-width="3" paint-order="stroke"'))
    body.append(f'<line class="axis" x1="{plot_left:.2f}" y1="{top}" x2="{plot_left:.2f}" y2="{bottom}" '
                f'stroke="{TEXT_COLOR}" stroke-width="1"/>')
    if panel.target is not None:
        x = x_of(panel.target)
        body.append(f'<line class="target" x1="{x:.3f}" y1="{target_top:.1f}" x2="{x:.3f}" y2="{bottom}" '
                    f'stroke="{TARGET_COLOR}" stroke-width="1.5" stroke-dasharray="5,4"/>')
    body.extend(labels)
    return bottom + 18
