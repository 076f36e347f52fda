"""The result document's two views: the page, and the same document as a download.

Thin: who is asking (the dashboard's session), one selector, one renderer. Agents' bearer
tokens are not read here: a document is for people.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views import View

from kernel.actors import actor_from_request
from kernel.errors import NotFound, PermissionDenied
from reports.render import CONTENT_SECURITY_POLICY, document_html, download_name
from reports.selectors import job_document


class _DocumentView(View):
    download = False

    def get(self, request: HttpRequest, job_id: int) -> HttpResponse:
        if not request.user.is_authenticated:
            return _refused(request, 401, "Sign in on the dashboard first, then open this again.")
        try:
            document = job_document(actor=actor_from_request(request), job_id=job_id)
        except NotFound as e:
            return _refused(request, 404, e.message)
        except PermissionDenied as e:
            return _refused(request, 403, e.message)
        if self.download:
            html = document_html(document)
        else:
            html = document_html(
                document,
                download_url=reverse("job-document-download", args=[job_id]),
                dashboard_url=f"/#/jobs/{job_id}",
            )
        response = HttpResponse(html, content_type="text/html; charset=utf-8")
        response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        response["Cache-Control"] = "private, no-store"
        if self.download:
            response["Content-Disposition"] = f'attachment; filename="{download_name(document)}"'
        return response


class JobDocumentView(_DocumentView):
    """``GET /jobs/<id>/document/``: the job's result document as a page."""


class JobDocumentDownloadView(_DocumentView):
    """``GET /jobs/<id>/document/download/``: the same document as one self-contained
    HTML file to keep (no link, script or reference to anything outside it)."""

    download = True


def _refused(request: HttpRequest, status: int, message: str) -> HttpResponse:
    return render(
        request, "reports/refused.html", {"status": status, "message": message}, status=status
    )
