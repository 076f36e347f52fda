"""API routes of the hospitals app."""

urlpatterns: list = []
