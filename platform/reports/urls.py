"""Routes of the result documents (included at the root: they are pages, not the API)."""

from django.urls import path

from reports import views

urlpatterns = [
    path("jobs/<int:job_id>/document/", views.JobDocumentView.as_view(), name="job-document"),
    path(
        "jobs/<int:job_id>/document/download/",
        views.JobDocumentDownloadView.as_view(),
        name="job-document-download",
    ),
]
