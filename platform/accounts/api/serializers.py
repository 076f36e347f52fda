"""What the accounts API takes and gives."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from rest_framework import serializers

from accounts.selectors import membership_of
from kernel.actors import Role
from kernel.api.strict import StrictBooleanField, StrictCharField, StrictSerializer

ROLE_CHOICES = [r.value for r in Role]


class SignInSerializer(StrictSerializer):
    username = StrictCharField(max_length=150)
    password = StrictCharField(max_length=4096, trim_whitespace=False, write_only=True)


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.ChoiceField(choices=ROLE_CHOICES, allow_null=True)
    hospital = serializers.CharField(allow_null=True, help_text="slug, for a hospital admin")


class PersonSerializer(serializers.ModelSerializer):
    role = serializers.SerializerMethodField()
    hospital = serializers.SerializerMethodField(help_text="slug, for a hospital admin")

    class Meta:
        model = get_user_model()
        fields = [
            "id",
            "username",
            "email",
            "role",
            "hospital",
            "is_active",
            "date_joined",
            "last_login",
        ]
        read_only_fields = fields

    def get_role(self, person) -> str | None:
        role, _ = membership_of(person)
        return role.value if role is not None else None

    def get_hospital(self, person) -> str | None:
        _, hospital = membership_of(person)
        return hospital.slug if hospital is not None else None


class PersonCreateSerializer(StrictSerializer):
    username = StrictCharField(max_length=150)
    password = StrictCharField(max_length=4096, trim_whitespace=False, write_only=True)
    role = serializers.ChoiceField(choices=ROLE_CHOICES)
    hospital = StrictCharField(
        max_length=64,
        required=False,
        allow_null=True,
        default=None,
        help_text="the hospital's slug; required for (and only for) hospital admins",
    )
    email = serializers.EmailField(required=False, allow_blank=True, default="")


class PersonUpdateSerializer(StrictSerializer):
    role = serializers.ChoiceField(
        choices=ROLE_CHOICES, required=False, allow_null=True, help_text="null: no role"
    )
    hospital = StrictCharField(max_length=64, required=False, allow_null=True)
    is_active = StrictBooleanField(required=False)
