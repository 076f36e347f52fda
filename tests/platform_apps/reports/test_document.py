"""A finished job's result document: served as a page, downloaded as one self-contained
HTML file that holds the audit chain's head at the end of the job and its verification."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser

import pytest

from audit.models import AuditEvent
from tests.platform_apps.audit.support import EVENTS, tamper
from tests.platform_apps.reports.conftest import FIGURES

pytestmark = pytest.mark.django_db

PNG = b"\x89PNG\r\n\x1a\n"


class _References(HTMLParser):
    """Every attribute that can make a browser fetch or leave the page, every tag, and the
    text of every style block."""

    def __init__(self) -> None:
        super().__init__()
        self.references: list[tuple[str, str, str]] = []
        self.tags: set[str] = set()
        self.styles: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self._in_style = tag == "style"
        for name, value in attrs:
            if name in {"src", "href", "srcset", "action", "formaction", "poster", "data"}:
                self.references.append((tag, name, value or ""))
            if name == "style":
                self.styles.append(value or "")

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.styles.append(data)


def _download(client, job) -> tuple[str, object]:
    response = client.get(f"/jobs/{job.pk}/document/download/")
    assert response.status_code == 200, response.content[:500]
    return response.content.decode("utf-8"), response


def test_the_downloaded_document_is_one_self_contained_file(
    client_for, consortium_admin, finished_job
) -> None:
    html, response = _download(client_for(consortium_admin), finished_job)
    assert response["Content-Disposition"] == (
        f'attachment; filename="medsplit-job-{finished_job.pk}-pneumonia-screening.html"'
    )
    parsed = _References()
    parsed.feed(html)
    outside = [r for r in parsed.references if not r[2].startswith(("data:", "#"))]
    assert not outside, f"the file refers outside itself: {outside}"
    assert not parsed.tags & {"script", "link", "iframe", "object", "embed", "base"}
    for style in parsed.styles:  # no url(...) or @import to fetch from
        assert "url(" not in style and "@import" not in style
    images = [v for tag, name, v in parsed.references if tag == "img" and name == "src"]
    assert len(images) == 4  # the loss, validation, final metrics and traffic charts
    for image in images:
        assert image.startswith("data:image/png;base64,")
        assert base64.b64decode(image.split(",", 1)[1]).startswith(PNG)
    anchors = {v[1:] for tag, name, v in parsed.references if v.startswith("#")}
    assert anchors and all(f'id="{a}"' in html for a in anchors)  # in-page, and there

    for figures in FIGURES.values():  # every hospital's part, for a consortium admin
        assert f"{2 * figures.bytes_up} B" in html
        if figures.test is not None:
            assert f"{figures.test['accuracy']:.4f}" in html
    assert "weighted by their test-set sizes (not pooled)" in html
    assert "pneumonia screening" in html and "small_cnn" in html


def test_the_document_holds_the_audit_head_at_the_end_of_the_job_and_its_verification(
    client_for, consortium_admin, finished_job
) -> None:
    # The job's last row: its final model's evaluation at the last hospital, after the
    # job completed.
    last = AuditEvent.objects.filter(job_id=finished_job.pk).order_by("-id").first()
    assert last.action == "evaluation.hospital_completed"
    client = client_for(consortium_admin)
    html, _ = _download(client, finished_job)
    assert re.search(rf'data-testid="audit-head-seq">{last.id}<', html)
    assert re.search(rf'data-testid="audit-head-hash">{last.hash}<', html)
    verification = re.search(r'data-testid="audit-verification">(.*?)</td>', html, re.S).group(1)
    assert verification.startswith('<span class="ok">verified</span>')

    # A row rewritten behind the coordinator's back: the next document says so, and where.
    tamper(f"UPDATE {EVENTS} SET action = 'job.forged' WHERE id = %s", [last.id])
    html, _ = _download(client, finished_job)
    verification = re.search(r'data-testid="audit-verification">(.*?)</td>', html, re.S).group(1)
    assert verification.startswith('<span class="bad">does not verify</span>')
    assert f"row {last.id}" in verification and "content_hash_mismatch" in verification


def test_the_page_links_back_to_the_dashboard_and_to_its_download(
    client_for, consortium_admin, finished_job
) -> None:
    response = client_for(consortium_admin).get(f"/jobs/{finished_job.pk}/document/")
    assert response.status_code == 200
    assert response["Content-Security-Policy"].startswith("default-src 'none'; img-src data:")
    html = response.content.decode()
    assert f'href="/jobs/{finished_job.pk}/document/download/"' in html
    assert f'href="/#/jobs/{finished_job.pk}"' in html
    assert "Content-Disposition" not in response


def test_someone_not_signed_in_gets_no_document(client_for, finished_job) -> None:
    response = client_for().get(f"/jobs/{finished_job.pk}/document/download/")
    assert response.status_code == 401
    assert "pneumonia" not in response.content.decode()
