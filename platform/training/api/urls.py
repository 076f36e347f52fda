"""API routes of the training app."""

urlpatterns: list = []
