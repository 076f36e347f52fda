"""Only the audit API, for checking its part of the schema on its own."""

from django.urls import include, path

urlpatterns = [path("api/", include("audit.api.urls"))]
