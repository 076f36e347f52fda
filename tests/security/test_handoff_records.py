"""Attack: a hospital records hand-offs it did not make.

The coordinator keeps, per hand-off, the SHA-256 and size of the blob a hospital sealed
for another after its turn; the recipient opens only a blob with the recorded hash. A
hostile hospital that could record for another's turn would make the next hospital
refuse the honest blob (a stalled job) or, with the honest sender's record taken first,
deny it. Against the coordinator's API and database (the agent's batch endpoint, all or
none): a hospital records only for its own turns, never in another's name, and a batch
with one bad entry records nothing.
"""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from tests.platform_apps.training.api.test_views import started
from training.models import HandOff, Turn


def _batch(turn: Turn, *recipients: str, digest: str = "a") -> dict:
    entries = [
        {"recipient": r, "ciphertext_sha256": digest * 64, "size_bytes": 64} for r in recipients
    ]
    return {"turn": turn.pk, "handoffs": entries}


@pytest.mark.django_db
def test_a_hospital_records_no_hand_off_for_a_turn_not_its_own_and_a_bad_batch_records_nothing(
    make_job, agent_client, hospital_a, hospital_b, hospital_c
) -> None:
    hospitals = (hospital_a, hospital_b, hospital_c)
    job = started(make_job(participants=[{"hospital": h.slug} for h in hospitals]))
    turn = Turn.objects.get(job=job, status="running")
    honest = turn.hospital
    hostile, third = [h for h in hospitals if h != honest]
    url = f"/api/agent/assignments/{job.pk}/handoffs/batch/"

    # The hostile hospital records for the honest one's running turn: not its turn.
    forged = agent_client(hostile).post(url, _batch(turn, third.slug), format="json")
    assert forged.status_code == 404, forged.content
    assert forged.json()["code"] == "not_found"
    # Not even "for itself" from another's turn (the sender is always the caller's turn's).
    assert (
        agent_client(hostile).post(url, _batch(turn, hostile.slug), format="json").status_code
        == 404
    )

    # The honest hospital's batch with one entry for a hospital outside the job: nothing.
    outsider = _batch(turn, third.slug, "nowhere")
    refused = agent_client(honest).post(url, outsider, format="json")
    assert refused.status_code == 400 and "nowhere" in str(refused.json()["details"])
    assert not HandOff.objects.exists()
    assert not AuditEvent.objects.filter(action="handoff.recorded").exists()

    # Its honest batch goes through, in its own name.
    done = agent_client(honest).post(url, _batch(turn, hostile.slug, third.slug), format="json")
    assert done.status_code == 201, done.content
    assert set(HandOff.objects.values_list("sender", flat=True)) == {honest.pk}
    # A second batch with another blob for a recipient already recorded changes nothing.
    again = agent_client(honest).post(url, _batch(turn, third.slug, digest="b"), format="json")
    assert again.status_code == 409
    assert set(HandOff.objects.values_list("ciphertext_sha256", flat=True)) == {"a" * 64}
