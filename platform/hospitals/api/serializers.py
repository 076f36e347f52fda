"""What the hospitals API takes and gives. Input is refused field by field (400) when it
is of the wrong type, out of bounds or unknown."""

from __future__ import annotations

import re
from typing import Any

from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from audit.witness import audit_head
from hospitals.hijack import hijack_alerts
from hospitals.models import AgentToken, Hospital
from hospitals.selectors import hospital_is_online
from kernel.api.strict import (
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictSerializer,
)
from medsplit.training.tasks import DEFAULT_TASK, SEGMENTATION, TASKS

MAX_IMAGE_DIMS = 4  # (C, H, W) or (C, D, H, W)
MAX_IMAGE_SIDE = 16384
MAX_COUNT = 10**9
MAX_LABELS = 1000
LABEL_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


# -- the dataset summary an agent reports -------------------------------------------


class SplitSizesSerializer(StrictSerializer):
    """How many samples each split holds."""

    train = StrictIntegerField(min_value=0, max_value=MAX_COUNT, required=False)
    val = StrictIntegerField(min_value=0, max_value=MAX_COUNT, required=False)
    test = StrictIntegerField(min_value=0, max_value=MAX_COUNT, required=False)


class DatasetSummarySerializer(StrictSerializer):
    """Sizes only, never data: the image shape, how many samples per label (a
    segmentation set: how many masks, and in how many of them each class appears), per
    split."""

    image_shape = serializers.ListField(
        child=StrictIntegerField(min_value=1, max_value=MAX_IMAGE_SIDE),
        min_length=1,
        max_length=MAX_IMAGE_DIMS,
        help_text="one image's shape, channels first, e.g. [1, 28, 28]",
    )
    label_counts = serializers.DictField(
        child=StrictIntegerField(min_value=0, max_value=MAX_COUNT),
        required=False,
        help_text=f'samples per label, e.g. {{"0": 120, "1": 300}}; at most {MAX_LABELS} '
        "labels; a classification set's only (needed there)",
    )
    split_sizes = SplitSizesSerializer(help_text='e.g. {"train": 400, "val": 20}')
    task = serializers.ChoiceField(
        choices=list(TASKS),
        required=False,
        help_text="classification (a label per image; the default) or segmentation (a mask "
        "per image)",
    )
    masks = StrictIntegerField(
        min_value=0,
        max_value=MAX_COUNT,
        required=False,
        help_text="a segmentation set's: how many masks (one per image)",
    )
    mask_classes = serializers.DictField(
        child=StrictIntegerField(min_value=0, max_value=MAX_COUNT),
        required=False,
        help_text="a segmentation set's: in how many masks each class appears, e.g. "
        f'{{"0": 40, "1": 37}}; at most {MAX_LABELS} classes',
    )

    test_label_counts = serializers.DictField(
        child=StrictIntegerField(min_value=0, max_value=MAX_COUNT),
        required=False,
        help_text="the local test set's samples per label (a classification set with a test "
        "set; its size is split_sizes.test)",
    )
    test_mask_classes = serializers.DictField(
        child=StrictIntegerField(min_value=0, max_value=MAX_COUNT),
        required=False,
        help_text="the local test set's masks each class appears in (a segmentation set with "
        "a test set of split_sizes.test masks)",
    )

    def validate_test_label_counts(self, value: dict[str, int]) -> dict[str, int]:
        return _labels(value, "labels")

    def validate_test_mask_classes(self, value: dict[str, int]) -> dict[str, int]:
        return self.validate_mask_classes(value)

    def validate_label_counts(self, value: dict[str, int]) -> dict[str, int]:
        return _labels(value, "labels")

    def validate_mask_classes(self, value: dict[str, int]) -> dict[str, int]:
        value = _labels(value, "classes")
        bad = sorted(label for label in value if not label.isdigit())[:5]
        if bad:
            raise serializers.ValidationError(f"mask classes are class indices 0, 1, ...: {bad!r}")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        self._validate_test(attrs)
        # Each task counts its own targets, and only those: a summary is one or the other.
        if attrs.get("task", DEFAULT_TASK) == SEGMENTATION:
            if "label_counts" in attrs:
                raise serializers.ValidationError(
                    {"label_counts": ["a segmentation set counts masks (mask_classes)"]}
                )
            for name in ("masks", "mask_classes"):
                if name not in attrs:
                    raise serializers.ValidationError({name: ["a segmentation set gives it"]})
            if any(count > attrs["masks"] for count in attrs["mask_classes"].values()):
                raise serializers.ValidationError(
                    {
                        "mask_classes": [
                            f"a class cannot appear in more than the {attrs['masks']} masks"
                        ]
                    }
                )
        else:
            if "label_counts" not in attrs:
                raise serializers.ValidationError({"label_counts": ["This field is required."]})
            for name in ("masks", "mask_classes"):
                if name in attrs:
                    raise serializers.ValidationError(
                        {name: ["only a segmentation set counts masks"]}
                    )
        return attrs

    def _validate_test(self, attrs: dict[str, Any]) -> None:
        """A test set's counts come with its size, are of the set's task, and add up."""
        size = attrs["split_sizes"].get("test")
        segmentation = attrs.get("task", DEFAULT_TASK) == SEGMENTATION
        own, other = (
            ("test_mask_classes", "test_label_counts")
            if segmentation
            else ("test_label_counts", "test_mask_classes")
        )
        if other in attrs:
            raise serializers.ValidationError({other: ["not of this set's task"]})
        if not size:
            if own in attrs:
                raise serializers.ValidationError({own: ["a test set gives split_sizes.test"]})
            return
        if own not in attrs:
            raise serializers.ValidationError({own: ["a test set (split_sizes.test) gives it"]})
        counts = attrs[own].values()
        # No counts at all: a vertical party without labels (its records' features only).
        unlabelled = not segmentation and not counts and not attrs.get("label_counts")
        if unlabelled:
            return
        if (sum(counts) != size) if not segmentation else any(n > size for n in counts):
            raise serializers.ValidationError(
                {own: [f"does not fit the test set's {size} samples (split_sizes.test)"]}
            )


def _labels(value: dict[str, int], what: str) -> dict[str, int]:
    if len(value) > MAX_LABELS:
        raise serializers.ValidationError(f"at most {MAX_LABELS} {what}, got {len(value)}")
    bad = sorted(label for label in value if not LABEL_PATTERN.fullmatch(label))[:5]
    if bad:
        raise serializers.ValidationError(
            f"{what} are 1 to 64 letters, digits, '_', '.' or '-': {bad!r}"
        )
    return value


class HeartbeatSerializer(StrictSerializer):
    agent_status = serializers.ChoiceField(choices=Hospital.AgentStatus.choices)
    agent_version = StrictCharField(
        max_length=64,
        validators=[RegexValidator(r"^[A-Za-z0-9][A-Za-z0-9.+_-]*$", "e.g. 1.2.0 or 1.2.0+dev")],
    )
    dataset_summary = DatasetSummarySerializer(
        required=False, help_text="left out when the data cannot be used (see data_problem)"
    )
    data_problem = StrictCharField(
        max_length=2000,
        required=False,
        allow_blank=True,
        default="",
        help_text="why the local data cannot be used: files and checks, never data",
    )
    started_at = serializers.DateTimeField(
        required=False, help_text="when the agent's process started (a new one: a restart)"
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "dataset_summary" not in attrs and not attrs.get("data_problem"):
            raise serializers.ValidationError(
                {"dataset_summary": ["give the data's summary, or the data_problem"]}
            )
        return attrs


# -- hospitals ----------------------------------------------------------------------


class RelaySuspensionSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    reason = serializers.CharField()


class HospitalSerializer(serializers.ModelSerializer):
    online = serializers.SerializerMethodField(
        help_text="heard from within HOSPITAL_OFFLINE_AFTER_SECONDS"
    )
    dataset_summary = serializers.SerializerMethodField()
    relay_suspension = serializers.SerializerMethodField(
        help_text="why its relay user is suspended, and since when; null when it is not"
    )
    hijack_alerts = serializers.SerializerMethodField(
        help_text="jobs in which its agent found the server hijacking its training and "
        "stopped taking part (privacy.hijack_detection): job, turn, when, the reason"
    )

    class Meta:
        model = Hospital
        fields = [
            "slug",
            "name",
            "contact_email",
            "status",
            "created_at",
            "approved_at",
            "enrolled_at",
            "online",
            "last_seen_at",
            "agent_status",
            "agent_version",
            "identity_fingerprint",
            "identity_generation",
            "identity_enrolled_at",
            "legacy_public_key",
            "dataset_summary",
            "data_problem",
            "relay_suspension",
            "hijack_alerts",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "identity_fingerprint": {
                "help_text": "SHA-256 of the agent's ML-DSA-65 identity key, pinned at "
                "enrolment: compare it (in groups of four) with `medsplit-agent status` at "
                "the hospital"
            },
            "identity_generation": {
                "help_text": "how many identity keys it has had; each re-enrolment with a "
                "new key adds one"
            },
            "legacy_public_key": {
                "help_text": "the X25519 key of an agent enrolled before identity keys "
                "(kept for the record)"
            },
        }

    def get_online(self, hospital: Hospital) -> bool:
        return hospital_is_online(hospital=hospital)

    @extend_schema_field(RelaySuspensionSerializer(allow_null=True))
    def get_relay_suspension(self, hospital: Hospital) -> dict[str, Any] | None:
        credential = getattr(hospital, "redis", None)
        if credential is None or credential.suspended_at is None:
            return None
        return {"since": credential.suspended_at, "reason": credential.suspended_reason}

    @extend_schema_field(serializers.ListField(child=serializers.DictField()))
    def get_hijack_alerts(self, hospital: Hospital) -> list[dict[str, Any]]:
        return hijack_alerts(hospital=hospital.slug)

    @extend_schema_field(DatasetSummarySerializer(allow_null=True))
    def get_dataset_summary(self, hospital: Hospital) -> dict[str, Any] | None:
        return hospital.dataset_summary or None


class HospitalRegisterSerializer(StrictSerializer):
    name = StrictCharField(max_length=200)
    slug = StrictCharField(
        max_length=64, required=False, help_text="made from the name when left out"
    )
    contact_email = serializers.EmailField(required=False, allow_blank=True, default="")
    approve = StrictBooleanField(
        required=False,
        default=True,
        help_text="approve at once and issue an enrolment code (default), or leave requested",
    )


class JoinRequestSerializer(StrictSerializer):
    name = StrictCharField(max_length=200)
    slug = StrictCharField(max_length=64, required=False)
    contact_email = serializers.EmailField()


class JoinRequestAnswerSerializer(serializers.Serializer):
    slug = serializers.CharField()
    status = serializers.CharField()


class RejectSerializer(StrictSerializer):
    reason = StrictCharField(max_length=500, required=False, allow_blank=True, default="")


class EnrolmentCodeSerializer(serializers.Serializer):
    code = serializers.CharField(
        source="plaintext", help_text="msc_<key id>_<secret>: shown this once, single use"
    )
    key_id = serializers.CharField()
    expires_at = serializers.DateTimeField()


class RegistrationSerializer(serializers.Serializer):
    hospital = HospitalSerializer()
    enrolment_code = EnrolmentCodeSerializer(allow_null=True)


class TokenMetadataSerializer(serializers.ModelSerializer):
    active = serializers.BooleanField(source="is_active")

    class Meta:
        model = AgentToken
        fields = ["key_id", "created_at", "last_used_at", "revoked_at", "active"]
        read_only_fields = fields


class RevocationSerializer(serializers.Serializer):
    hospital = HospitalSerializer()
    tokens_revoked = serializers.IntegerField()
    codes_revoked = serializers.IntegerField()
    relay_user_revoked = serializers.BooleanField()


# -- agents -------------------------------------------------------------------------


#: Base64 of a 1,952-byte ML-DSA-65 public key.
IDENTITY_KEY_CHARS = 2604


class EnrolSerializer(StrictSerializer):
    code = StrictCharField(max_length=256, help_text="the one-time msc_... code")
    identity_key = StrictCharField(
        max_length=IDENTITY_KEY_CHARS,
        help_text="the agent's ML-DSA-65 identity public key: 1,952 bytes, base64",
    )


class IdentityMoveSerializer(StrictSerializer):
    identity_key = StrictCharField(
        max_length=IDENTITY_KEY_CHARS,
        help_text="the agent's first ML-DSA-65 identity public key: 1,952 bytes, base64",
    )


class IdentitySerializer(serializers.Serializer):
    """The identity key the coordinator pinned for the agent's hospital."""

    fingerprint = serializers.CharField(
        source="identity_fingerprint", help_text="SHA-256 of the identity key, hex"
    )
    generation = serializers.IntegerField(source="identity_generation")
    enrolled_at = serializers.DateTimeField(source="identity_enrolled_at")


class IssuedTokenSerializer(serializers.Serializer):
    token = serializers.CharField(
        source="plaintext", help_text="msa_<key id>_<secret>: shown this once"
    )
    key_id = serializers.CharField()


class RelayCredentialsSerializer(serializers.Serializer):
    url = serializers.CharField(help_text="the relay's REDIS_URL")
    username = serializers.CharField()
    password = serializers.CharField(help_text="shown this once")
    key_pattern = serializers.CharField(help_text="the only keys this user may touch")


class EnrolmentSerializer(serializers.Serializer):
    hospital = serializers.CharField(source="hospital.slug")
    status = serializers.CharField(source="hospital.status")
    identity = IdentitySerializer(source="hospital")
    token = IssuedTokenSerializer()
    relay = RelayCredentialsSerializer()


class AuditHeadSerializer(serializers.Serializer):
    seq = serializers.IntegerField(help_text="the last event's sequence number")
    hash = serializers.CharField(help_text="the last event's hash")


class AgentHospitalSerializer(serializers.ModelSerializer):
    """What the coordinator now knows of the agent (its hospital is enrolled: a suspended
    hospital's token would have been refused), and the audit chain's head for the agent
    to witness (``audit.witness``)."""

    online = serializers.SerializerMethodField()
    audit_head = serializers.SerializerMethodField()

    class Meta:
        model = Hospital
        fields = ["slug", "online", "last_seen_at", "agent_status", "agent_version", "audit_head"]
        read_only_fields = fields

    def get_online(self, hospital: Hospital) -> bool:
        return hospital_is_online(hospital=hospital)

    @extend_schema_field(AuditHeadSerializer)
    def get_audit_head(self, hospital: Hospital) -> dict[str, Any]:
        head = audit_head()
        return {"seq": head.seq, "hash": head.hash}


class ChainLinkSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    prev_hash = serializers.CharField()
    hash = serializers.CharField()


class ChainLinksSerializer(serializers.Serializer):
    links = ChainLinkSerializer(many=True)
    head = AuditHeadSerializer()


class WitnessStatementSerializer(StrictSerializer):
    statement = StrictCharField(
        max_length=8192,
        help_text="canonical JSON: hospital, witnessed {seq, hash}, found, message, at",
    )
    signature = StrictCharField(max_length=16000, help_text="ML-DSA-65 signature, base64")
