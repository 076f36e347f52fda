"""URL routes: the REST API under /api/, its schema and docs, and Django's admin."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/", include("accounts.api.urls")),
    path("api/", include("hospitals.api.urls")),
    path("api/", include("training.api.urls")),
    path("api/", include("audit.api.urls")),
]
