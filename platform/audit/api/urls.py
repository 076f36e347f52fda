"""API routes of the audit app (under /api/)."""

from django.urls import path

from audit.api import views

urlpatterns = [
    path("audit/events/", views.AuditEventListView.as_view(), name="audit-events"),
    path("audit/export.csv", views.AuditExportCsvView.as_view(), name="audit-export-csv"),
    path("audit/export.jsonl", views.AuditExportJsonlView.as_view(), name="audit-export-jsonl"),
    path("audit/verify/", views.AuditVerifyView.as_view(), name="audit-verify"),
    path(
        "audit/witness-reports/",
        views.WitnessReportListView.as_view(),
        name="audit-witness-reports",
    ),
]
