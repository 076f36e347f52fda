"""URL routes: the dashboard at /, the REST API under /api/, its schema and docs,
Prometheus metrics at /metrics, a job's result document at /jobs/<id>/document/, and
Django's admin only with ``MEDSPLIT_DJANGO_ADMIN=1``."""

from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.generic import TemplateView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from monitoring.views import MetricsView

# The dashboard is one page that reads and writes through the API (session + CSRF).
dashboard = ensure_csrf_cookie(TemplateView.as_view(template_name="index.html"))

urlpatterns = [
    path("", dashboard, name="dashboard"),
    path("metrics", MetricsView.as_view(), name="metrics"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/", include("accounts.api.urls")),
    path("api/", include("hospitals.api.urls")),
    path("api/", include("training.api.urls")),
    path("api/", include("audit.api.urls")),
    path("api/", include("exports.api.urls")),
    path("api/", include("monitoring.urls")),
    # A job's result document: an HTML page and its download, beside the dashboard.
    path("", include("reports.urls")),
]

# Off by default in production: every change goes through the API's services, and the
# admin's pages are read-only (coordinator/admin_site.py has no login form of its own).
if settings.MEDSPLIT["DJANGO_ADMIN"]:
    urlpatterns.append(path("admin/", admin.site.urls))
