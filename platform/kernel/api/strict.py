"""Serializer pieces that refuse what they do not expect.

DRF ignores unknown fields and turns ``True`` or ``"12"`` into integers; an API that
takes security-relevant input (and must never take data by accident) refuses both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers


class StrictSerializer(serializers.Serializer):
    """A serializer that answers 400 for any field it does not declare (nested too)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            writable = {name for name, field in self.fields.items() if not field.read_only}
            unknown = sorted(str(key) for key in data if key not in writable)
            if unknown:
                raise serializers.ValidationError({key: ["unknown field"] for key in unknown})
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer: not a boolean, a float or a string of digits."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """A JSON boolean: not ``"yes"``, ``1`` or ``"true"``."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictCharField(serializers.CharField):
    """A JSON string: DRF would otherwise turn numbers into strings."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)
