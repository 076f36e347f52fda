from django.urls import path

from exports.api import views

urlpatterns = [
    path("jobs/<int:job_id>/exports/", views.ExportCreateView.as_view(), name="export-create"),
    path(
        "agent/exports/<int:export_id>/approve/",
        views.AgentApproveView.as_view(),
        name="agent-export-approve",
    ),
    path(
        "agent/exports/<int:export_id>/refuse/",
        views.AgentRefuseView.as_view(),
        name="agent-export-refuse",
    ),
]
