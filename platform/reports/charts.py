"""The result document's charts, drawn on the server as PNG and embedded as data URIs, so
that the document needs nothing but itself (no script, no chart library, no network).

matplotlib's object API on the Agg canvas: no pyplot, so no global figure state shared
between the coordinator's threads, and no display needed.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter

#: Ten colours told apart at a glance, the dashboard's (frontend/src/pages/job.js).
COLOURS = (
    "#1f5fbf", "#c2410c", "#15803d", "#7c3aed", "#b91c1c",
    "#0e7490", "#a16207", "#be185d", "#4d7c0f", "#334155",
)  # fmt: skip
WIDTH_IN, HEIGHT_IN, DPI = 7.0, 3.2, 110


def colour(index: int) -> str:
    return COLOURS[index % len(COLOURS)]


def _figure() -> Figure:
    figure = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _data_uri(figure: Figure) -> str:
    buffer = io.BytesIO()
    # No metadata: the same figures give the same bytes, whatever matplotlib wrote them.
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def loss_chart(
    series: Sequence[tuple[str, Sequence[Sequence[float]]]], round_starts: Sequence[int]
) -> str:
    """Training loss, one curve per hospital (label, [[step, loss]]), rounds marked; a
    hospital's curve breaks where a round starts between two of its points (its turns in
    two rounds, the others' turns between them)."""
    figure = _figure()
    axes = figure.add_subplot()
    for start in round_starts:
        axes.axvline(start, color="#8a8f98", linestyle=(0, (4, 4)), linewidth=0.8)
    for i, (label, points) in enumerate(series):
        for n, part in enumerate(_turns(points, round_starts)):
            axes.plot(
                [p[0] for p in part], [p[1] for p in part],
                label=label if n == 0 else None, color=colour(i), linewidth=1.2,
            )  # fmt: skip
    axes.set_xlabel("step of the job (the hospitals' turns one after another)")
    axes.set_ylabel("training loss")
    if any(points for _, points in series):
        figure.legend(loc="outside upper center", ncols=min(len(series), 5), fontsize="small")
    return _data_uri(figure)


def _turns(
    points: Sequence[Sequence[float]], round_starts: Sequence[int]
) -> list[list[Sequence[float]]]:
    parts: list[list[Sequence[float]]] = []
    for point in points:
        if parts and not any(parts[-1][-1][0] <= s < point[0] for s in round_starts):
            parts[-1].append(point)
        else:
            parts.append([point])
    return parts


def validation_chart(
    series: Sequence[tuple[str, Sequence[tuple[int, float | None]], float | None]],
    metric_name: str,
    rounds: int,
) -> str:
    """The validation metric by round, one line per hospital (label, [(round, value)],
    baseline), each baseline dotted in its hospital's colour."""
    figure = _figure()
    axes = figure.add_subplot()
    for i, (label, points, baseline) in enumerate(series):
        shown = [(r + 1, v) for r, v in points if v is not None]
        if shown:
            axes.plot(
                [r for r, _ in shown], [v for _, v in shown], marker="o",
                label=label, color=colour(i),
            )  # fmt: skip
        if baseline is not None:
            axes.axhline(baseline, color=colour(i), linestyle=":", linewidth=1)
    axes.set_xlim(0.5, max(rounds, 1) + 0.5)
    axes.set_xticks(range(1, max(rounds, 1) + 1))
    axes.set_ylim(0, 1)
    axes.set_xlabel("round")
    axes.set_ylabel(f"validation {metric_name}")
    if any(points for _, points, _ in series):
        figure.legend(loc="outside upper center", ncols=min(len(series), 5), fontsize="small")
    return _data_uri(figure)


def bars_chart(
    labels: Sequence[str],
    groups: Mapping[str, Sequence[float]],
    ylabel: str,
    *,
    ylim: tuple[float, float] | None = None,
    unit: str = "",
) -> str:
    """Grouped bars: one group per label, one bar per named series; ``unit`` (``"B"``)
    writes the axis in engineering notation (kB, MB)."""
    figure = _figure()
    axes = figure.add_subplot()
    count = max(len(groups), 1)
    width = 0.8 / count
    for i, (name, values) in enumerate(groups.items()):
        xs = [x + (i - (count - 1) / 2) * width for x in range(len(labels))]
        axes.bar(xs, values, width=width, label=name, color=colour(i))
    axes.set_xticks(range(len(labels)), labels)
    axes.set_ylabel(ylabel)
    if ylim is not None:
        axes.set_ylim(*ylim)
    if unit:
        axes.yaxis.set_major_formatter(EngFormatter(unit=unit))
    if groups:
        figure.legend(loc="outside upper center", ncols=min(len(groups), 5), fontsize="small")
    return _data_uri(figure)
