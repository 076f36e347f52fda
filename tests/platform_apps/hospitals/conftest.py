"""Fixtures of the hospitals tests: hospitals in each status, the relay hook."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hospitals.models import Hospital
from tests.platform_apps.conftest import make_hospital
from tests.platform_apps.hospitals.fixtures import client_as, fresh_throttles
from tests.platform_apps.hospitals.helpers import use_provisioner
from tests.platform_apps.hospitals.provisioners import RecordingProvisioner

__all__ = ["client_as", "fresh_throttles"]


@pytest.fixture
def requested_hospital(db: None) -> Hospital:
    return make_hospital("north-clinic", status=Hospital.Status.REQUESTED)


@pytest.fixture
def approved_hospital(db: None) -> Hospital:
    return make_hospital("lakeside", status=Hospital.Status.APPROVED)


@pytest.fixture
def recorder() -> Iterator[type[RecordingProvisioner]]:
    """The relay hook, recording its calls."""
    RecordingProvisioner.calls.clear()
    with use_provisioner("RecordingProvisioner"):
        yield RecordingProvisioner
    RecordingProvisioner.calls.clear()
