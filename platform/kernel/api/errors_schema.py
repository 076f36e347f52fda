"""The platform's error body, for the OpenAPI schema (coordinator/errors.py renders it)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers


class ErrorSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="stable, machine-readable: clients switch on it")
    message = serializers.CharField(help_text="what went wrong, for a person")
    details = serializers.DictField(help_text="per-field problems, or facts about the error")


def error(description: str) -> OpenApiResponse:
    """An error answer with the one error body."""
    return OpenApiResponse(response=ErrorSerializer, description=description)
