"""The relay ACL hook: naming, the default provisioner, choosing one by settings."""

from __future__ import annotations

import logging

import pytest

from hospitals.relay_acl import (
    NoRelayProvisioner,
    RedisAclProvisioner,
    get_provisioner,
    relay_key_pattern,
    relay_keys,
    relay_username,
)
from tests.platform_apps.hospitals.helpers import use_provisioner
from tests.platform_apps.hospitals.provisioners import RecordingProvisioner


def test_names_and_patterns(settings) -> None:
    prefix = settings.MEDSPLIT["RELAY_PREFIX"]
    assert relay_username("st-marys") == f"{prefix}-hospital-st-marys"
    assert relay_key_pattern("st-marys") == f"{prefix}:hospital:st-marys:*"


def test_the_pattern_covers_the_hospitals_streams_only() -> None:
    """The stream names of docs/protocol.md, checked with Redis' glob rules (fnmatch's
    are the same for ``*`` and plain characters)."""
    from fnmatch import fnmatchcase

    keys = relay_keys()
    pattern = relay_key_pattern("st-marys")
    own = keys.streams("job-12", "st-marys")
    other = keys.streams("job-12", "city-general")
    tricky = keys.streams("job-12", "st-marys-annex")
    assert fnmatchcase(own.up, pattern) and fnmatchcase(own.down, pattern)
    for stream in (other.up, other.down, tricky.up, tricky.down):
        assert not fnmatchcase(stream, pattern)


def test_the_default_only_says_no_relay_is_configured(caplog) -> None:
    provisioner = get_provisioner()
    assert isinstance(provisioner, NoRelayProvisioner)
    with caplog.at_level(logging.WARNING, logger="hospitals.relay_acl"):
        provisioner.provision(username="hospital-x", password_sha256="0" * 64, slug="x")
        provisioner.revoke(username="hospital-x")
    assert len(caplog.records) == 2
    assert all("no Redis relay provisioner" in r.getMessage() for r in caplog.records)
    assert "0" * 64 not in caplog.text


def test_the_setting_selects_the_provisioner() -> None:
    with use_provisioner("RecordingProvisioner"):
        assert isinstance(get_provisioner(), RecordingProvisioner)
    assert isinstance(RecordingProvisioner(), RedisAclProvisioner)


def test_a_setting_naming_something_else_is_refused() -> None:
    with use_provisioner("NotAProvisioner"), pytest.raises(TypeError):
        get_provisioner()
