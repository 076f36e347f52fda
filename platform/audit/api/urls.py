"""API routes of the audit app."""

urlpatterns: list = []
