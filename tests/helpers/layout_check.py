"""Text that a reader cannot read: what ``tests/test_figure_layout.py`` looks for in every figure.

``text_problems(fig)`` draws the figure and records every text artist as it is drawn (so only the tick
labels, titles, legends and notes actually on the canvas count), with its extent from matplotlib's
renderer, and returns one line per problem: a text that leaves the canvas, two texts that overlap, or an
axis's own text (a label, a tick label, a title) over the frame of another panel (a twin axes, which
shares its frame, excepted).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import matplotlib.text
from matplotlib.transforms import Bbox

SLACK = 1.0  # pixels: antialiasing and rounding of the extents


@contextmanager
def _recording(drawn: list):
    original = matplotlib.text.Text.draw

    def draw(self, renderer):
        original(self, renderer)
        if self.get_visible() and self.get_text().strip():
            drawn.append((self, self.get_window_extent(renderer).frozen()))

    matplotlib.text.Text.draw = draw
    try:
        yield
    finally:
        matplotlib.text.Text.draw = original


def _overlap(a: Bbox, b: Bbox) -> bool:
    return min(a.x1, b.x1) - max(a.x0, b.x0) > SLACK and min(a.y1, b.y1) - max(a.y0, b.y0) > SLACK


def _texts_overlap(a, box_a: Bbox, b, box_b: Bbox, renderer) -> bool:
    """Two texts at one angle (e.g. tick labels at 35 degrees) overlap when their rotated rectangles do:
    compared in their own frame, as their axis-aligned extents would overlap without touching. Texts at
    different angles are compared by their extents."""
    if a.get_rotation() != b.get_rotation() or a.get_rotation() % 90 == 0:
        return _overlap(box_a, box_b)
    theta = math.radians(a.get_rotation())
    (wa, ha), (wb, hb) = _upright_size(a, renderer), _upright_size(b, renderer)
    dx, dy = (
        box_b.x0 + box_b.width / 2 - box_a.x0 - box_a.width / 2,
        box_b.y0 + box_b.height / 2 - box_a.y0 - box_a.height / 2,
    )
    along = dx * math.cos(theta) + dy * math.sin(theta)
    across = -dx * math.sin(theta) + dy * math.cos(theta)
    return abs(along) < (wa + wb) / 2 - SLACK and abs(across) < (ha + hb) / 2 - SLACK


def _upright_size(text, renderer) -> tuple[float, float]:
    angle = text.get_rotation()
    text.set_rotation(0)
    try:
        box = text.get_window_extent(renderer)
    finally:
        text.set_rotation(angle)
    return box.width, box.height


def _name(text: matplotlib.text.Text) -> str:
    return repr(" ".join(text.get_text().split())[:40])


def text_problems(fig) -> list[str]:
    """One line per text that leaves the canvas or overlaps another text or another panel's frame."""
    drawn: list = []
    with _recording(drawn):
        fig.canvas.draw()
    canvas = fig.bbox
    renderer = fig.canvas.get_renderer()
    problems = []
    for text, box in drawn:
        if (
            box.x0 < canvas.x0 - SLACK
            or box.y0 < canvas.y0 - SLACK
            or box.x1 > canvas.x1 + SLACK
            or box.y1 > canvas.y1 + SLACK
        ):
            problems.append(f"{_name(text)} leaves the canvas ({box.bounds} of {canvas.bounds})")
    for i, (a, box_a) in enumerate(drawn):
        for b, box_b in drawn[i + 1 :]:
            if _texts_overlap(a, box_a, b, box_b, renderer):
                problems.append(f"{_name(a)} overlaps {_name(b)}")
    owners = {}  # an axes' own texts (axis labels and tick labels carry no .axes of their own)
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for t in [axis.label, axis.get_offset_text(), *axis.get_majorticklabels(), *axis.get_minorticklabels()]:
                owners[id(t)] = ax
        for t in [ax.title, ax._left_title, ax._right_title, *ax.texts]:
            owners[id(t)] = ax
    frames = [(ax, ax.get_window_extent(renderer)) for ax in fig.axes if ax.get_visible() and ax.axison]
    for text, box in drawn:
        own = owners.get(id(text), getattr(text, "axes", None))
        if own is None:
            continue
        own_frame = own.get_window_extent(renderer)
        for ax, frame in frames:
            twin = all(abs(u - v) < SLACK for u, v in zip(frame.extents, own_frame.extents))  # twinx: one frame
            if ax is not own and not twin and _overlap(box, frame):
                problems.append(f"{_name(text)} (of a panel) lies over another panel")
    return problems


MIN_POINTS = 7.0  # the smallest text a reader of a figure at its printed width can read


def small_text(fig, points: float = MIN_POINTS) -> list[str]:
    """One line per text drawn smaller than ``points`` (a 5 pt cell label)."""
    drawn: list = []
    with _recording(drawn):
        fig.canvas.draw()
    return [f"{_name(t)} is {t.get_fontsize():g} pt" for t, _ in drawn if t.get_fontsize() < points]


def legends_over_data(fig) -> list[str]:
    """One line per legend that covers a data point of a line, or part of a bar, of any panel (the issue's
    zero-ablation drop running behind a legend)."""
    import numpy as np
    from matplotlib.patches import Rectangle

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    problems = []
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            inside = ax.get_window_extent(renderer)
            for line in ax.get_lines():
                if not line.get_visible() or len(line.get_xydata()) == 0:
                    continue
                points = line.get_transform().transform(line.get_xydata())
                points = points[np.isfinite(points).all(1)]
                if line.get_linestyle() not in ("None", "", " ") and len(points) > 1:  # the segments too
                    t = np.linspace(0, 1, 50)[:, None, None]
                    points = (points[:-1] + t * (points[1:] - points[:-1])).reshape(-1, 2)
                seen = [p for p in points if inside.contains(*p)]  # drawn (not off the axis' limits)
                if any(box.contains(*p) for p in seen):
                    problems.append(f"a legend covers {line.get_label()!r}")
            for patch in ax.patches:
                if isinstance(patch, Rectangle) and patch.get_height() and _overlap(box, patch.get_window_extent(renderer)):
                    problems.append("a legend covers a bar")
                    break
    return problems


def title_gap(fig) -> float:
    """The share of the figure's height between the bottom of its suptitle and the top of its highest panel
    (with its title): an empty band under the title when large."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    if fig._suptitle is None:
        return 0.0
    title = fig._suptitle.get_window_extent(renderer)
    top = max(ax.get_tightbbox(renderer).y1 for ax in fig.axes if ax.get_visible())
    return max(title.y0 - top, 0.0) / fig.bbox.height
