"""One-time secrets under concurrent use: only one of two racing requests wins.

These need a database with row locks (PostgreSQL); run them with
``DATABASE_URL=postgres://postgres@127.0.0.1:5432/medsplit_hosp``.
"""

from __future__ import annotations

import pytest

from hospitals import services
from hospitals.errors import EnrolmentCodeUsed
from hospitals.models import AgentToken, EnrolmentCode, Hospital
from tests.platform_apps.concurrency import race
from tests.platform_apps.conftest import agent_actor, make_hospital
from tests.platform_apps.hospitals.helpers import issue_code, new_identity_key

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("needs_postgres")]


def test_one_code_used_twice_at_once_enrols_once() -> None:
    hospital = make_hospital("lakeside", status=Hospital.Status.APPROVED)
    code = issue_code(hospital)
    results = race(lambda: services.agent_enrol(code=code, identity_key=new_identity_key()))
    won = [r for r in results if isinstance(r, services.Enrolment)]
    lost = [r for r in results if isinstance(r, EnrolmentCodeUsed)]
    assert (len(won), len(lost)) == (1, 1), results
    assert AgentToken.objects.filter(hospital=hospital).count() == 1
    assert EnrolmentCode.objects.get().used_at is not None
    assert Hospital.objects.get(pk=hospital.pk).identity_key == Hospital.objects.get().identity_key


def test_one_token_rotated_twice_at_once_rotates_once() -> None:
    hospital = make_hospital("lakeside", status=Hospital.Status.APPROVED)
    enrolment = services.agent_enrol(code=issue_code(hospital), identity_key=new_identity_key())
    token = AgentToken.objects.get(key_id=enrolment.token.key_id)
    hospital.refresh_from_db()
    results = race(lambda: services.agent_token_rotate(actor=agent_actor(hospital), token=token))
    assert sum(isinstance(r, services.IssuedToken) for r in results) == 1, results
    assert AgentToken.objects.filter(revoked_at__isnull=True).count() == 1
