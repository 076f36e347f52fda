"""Hospitals enrolled before identity keys keep their X25519 key as legacy, with no identity
key (generation 0) until their agents move to one."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("hospitals", "0002_relay_suspension")]
AFTER = [("hospitals", "0003_identity_keys")]
LEGACY_KEY = "Bq6NbtcsGnhjaN0ybTA+2bkwVQu1nLXqtYIN2HeVbXo="


def test_the_x25519_key_of_a_hospital_enrolled_today_is_kept_as_legacy() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps.get_model("hospitals", "Hospital")
    old.objects.create(
        name="Old General", slug="old-general", status="enrolled", public_key=LEGACY_KEY
    )
    try:
        executor = MigrationExecutor(connection)
        executor.migrate(AFTER)
        new = executor.loader.project_state(AFTER).apps.get_model("hospitals", "Hospital")
        hospital = new.objects.get(slug="old-general")
        assert hospital.legacy_public_key == LEGACY_KEY
        assert (hospital.identity_key, hospital.identity_fingerprint) == ("", "")
        assert hospital.identity_generation == 0 and hospital.identity_enrolled_at is None
        # The fields are long enough for what they hold now (a TextField: no limit).
        hospital.identity_key = "A" * 2604
        hospital.save()
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
