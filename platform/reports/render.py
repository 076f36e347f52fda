"""A job's result document as one self-contained HTML file: the template, its styles
inline and its charts as PNG data URIs (:mod:`reports.charts`)."""

from __future__ import annotations

import re
from typing import Any

from django.template.loader import render_to_string
from django.utils.text import slugify

from reports.selectors import JobDocument

#: What the served document may load: its own inline styles and data: images, nothing
#: else (no script at all). The downloaded file is the same document.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'self'"
)


def document_charts(document: JobDocument) -> dict[str, str]:
    """The document's charts, by name, as data URIs."""
    # Imported here: a coordinator process pays for matplotlib only once it draws a chart.
    from reports import charts

    names = document.names
    order = [p.slug for p in document.participants]
    curves = {c["hospital"]: c["points"] for c in document.loss_series.get("series", [])}
    drawn = {
        "loss": charts.loss_chart(
            [(names.get(slug, slug), curves.get(slug, [])) for slug in order],
            [r["start"] for r in document.loss_series.get("rounds", [])],
        ),
        "validation": charts.validation_chart(
            [
                (
                    names.get(slug, slug),
                    [(r.round, r.metric) for r in document.validation.get(slug, [])],
                    document.baselines.get(slug) if document.metric == "accuracy" else None,
                )
                for slug in order
            ],
            document.metric_name,
            document.job.rounds,
        ),
    }
    if document.traffic:
        drawn["traffic"] = charts.bars_chart(
            [t.name for t in document.traffic],
            {
                "up at the cut": [t.bytes_up for t in document.traffic],
                "down at the cut": [t.bytes_down for t in document.traffic],
                "sealed hand-offs": [t.handoff_bytes for t in document.traffic],
            },
            "bytes",
            unit="B",
        )
    results = results_chart(document)
    if results:
        drawn["results"] = results
    return drawn


def results_chart(document: JobDocument) -> str | None:
    """The final figures of the hospitals the reader sees and their weighted mean, as
    bars (a figure not measured is left out: NaN draws nothing), or None before any."""
    results = document.results
    shown = [
        h
        for h in results.get("hospitals", [])
        if h.get("status") == "completed" and "test_samples" in h
    ]
    mean = results.get("weighted_mean")
    columns = [*shown, *([mean] if mean else [])]
    if not columns:
        return None
    labels = [h["name"] for h in shown] + (["weighted mean"] if mean else [])
    names = (
        {"dice": "mean Dice"}
        if results.get("task") == "segmentation"
        else {
            "accuracy": "accuracy",
            "baseline_accuracy": "majority-class baseline",
            "auc": "ROC AUC",
        }
    )
    from reports import charts

    nan = float("nan")
    groups = {
        label: [c.get(name) if isinstance(c.get(name), int | float) else nan for c in columns]
        for name, label in names.items()
    }
    return charts.bars_chart(labels, groups, "on the test sets", ylim=(0, 1))


def validation_rows(document: JobDocument) -> list[tuple[str, list[dict[str, Any]]]]:
    """Each hospital's validation by round with its majority-class baseline, for the table."""
    rows = []
    for p in document.participants:
        shown = document.validation.get(p.slug)
        if shown:
            baseline = document.baselines.get(p.slug)
            rows.append(
                (
                    p.name,
                    [
                        {"round": r.round, "metric": r.metric, "loss": r.loss, "baseline": baseline}
                        for r in shown
                    ],
                )
            )
    return rows


def document_html(document: JobDocument, *, download_url: str = "", dashboard_url: str = "") -> str:
    """The document as HTML. The served page carries links back to the dashboard and to
    its download (``dashboard_url``, ``download_url``); the downloaded file carries none."""
    return render_to_string(
        "reports/job_document.html",
        {
            "doc": document,
            "charts": document_charts(document),
            "validation_rows": validation_rows(document),
            "download_url": download_url,
            "dashboard_url": dashboard_url,
        },
    )


def download_name(document: JobDocument) -> str:
    """``medsplit-job-<id>-<name>.html``: a file name any system keeps."""
    name = slugify(document.job.name or "")[:60]
    return re.sub(r"-+", "-", f"medsplit-job-{document.job.pk}-{name}").strip("-") + ".html"
