"""Sealing hand-offs: HPKE (ML-KEM-768 + X25519) to the recipient's per-job key, signed by
the sender's ML-DSA-65 identity key. Only the recipient opens a blob, only for the context
it expects, and only when the hospital it pinned signed it.

Real cryptography throughout, no mocks.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os
from dataclasses import dataclass

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA65PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from medsplit.errors import MedSplitError, SealError
from medsplit.protocol.keys import (
    RECIPIENT_PUBLIC_BYTES,
    SIGNATURE_BYTES,
    RecipientKey,
    RecipientPublicKey,
    SignedRecipientKey,
    fingerprint,
    format_fingerprint,
    generate_identity_key,
    identity_key_from_bytes,
    identity_key_to_bytes,
    identity_public_b64,
    identity_public_from_b64,
)
from medsplit.protocol.sealing import (
    ENC_BYTES,
    FORMAT_VERSION,
    MAGIC,
    OVERHEAD_BYTES,
    SIGNING_CONTEXT,
    SUITE,
    SealContext,
    seal,
    unseal,
)

AUTH_FAILURE = "failed authentication"
CONTEXT = SealContext(job="job-3", round=0, sender="hosp-a", recipient="hosp-b")
HEADER = len(CONTEXT.canonical_bytes())
PREFIX = 11 + HEADER + 64  # magic, version, length, header, two digests


@dataclass(frozen=True)
class Keys:
    """The sender's identity key, the recipient's identity key and its per-job key."""

    sender: MLDSA65PrivateKey
    recipient: MLDSA65PrivateKey
    job_key: RecipientKey


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys(generate_identity_key(), generate_identity_key(), RecipientKey.generate())


def published(keys: Keys, context: SealContext = CONTEXT) -> SignedRecipientKey:
    """The recipient's per-job key as it publishes it for ``context``'s job."""
    return SignedRecipientKey.sign(
        job=context.job,
        hospital=context.recipient,
        key=keys.job_key.public(),
        identity=keys.recipient,
    )


def sealed(keys: Keys, plaintext: bytes = b"training state", context=CONTEXT) -> bytes:
    return seal(
        plaintext,
        sender=keys.sender,
        recipient=published(keys, context),
        recipient_identity=keys.recipient.public_key(),
        context=context,
    )


def opened(keys: Keys, blob: bytes, context: SealContext = CONTEXT) -> bytes:
    return unseal(blob, recipient=keys.job_key, sender=keys.sender.public_key(), context=context)


def resigned(blob: bytes, key: MLDSA65PrivateKey) -> bytes:
    """``blob`` with its signature replaced by ``key``'s over the same bytes."""
    body = blob[:-SIGNATURE_BYTES]
    return body + key.sign(hashlib.sha256(body).digest(), SIGNING_CONTEXT)


# --- round trips ------------------------------------------------------------------------


def test_round_trip(keys):
    assert opened(keys, sealed(keys, b"weights")) == b"weights"


def test_empty_plaintext_round_trips(keys):
    assert opened(keys, sealed(keys, b"")) == b""


def test_bytes_like_inputs_round_trip(keys):
    blob = sealed(keys, bytearray(b"state"))
    assert opened(keys, memoryview(blob)) == b"state"
    assert opened(keys, bytearray(blob)) == b"state"


def test_large_payload_round_trips(keys):
    payload = os.urandom(20 * 1024 * 1024)
    blob = sealed(keys, payload)
    assert len(blob) == len(payload) + OVERHEAD_BYTES + HEADER
    assert opened(keys, blob) == payload


def test_final_purpose_round_trips(keys):
    final = dataclasses.replace(CONTEXT, purpose="final")
    assert opened(keys, sealed(keys, b"final", final), final) == b"final"


def test_two_seals_of_the_same_plaintext_differ(keys):
    first, second = sealed(keys, b"same"), sealed(keys, b"same")
    assert first[:PREFIX] == second[:PREFIX]
    assert first[PREFIX : PREFIX + ENC_BYTES] != second[PREFIX : PREFIX + ENC_BYTES]  # fresh KEM
    assert opened(keys, first) == opened(keys, second) == b"same"


def test_ciphertext_does_not_hold_the_plaintext(keys):
    secret = b"patient-0042 " * 64
    assert b"patient-0042" not in sealed(keys, secret)


def test_blob_layout(keys):
    blob = sealed(keys, b"abc")
    header = CONTEXT.canonical_bytes()
    assert blob.startswith(MAGIC + bytes([FORMAT_VERSION]) + len(header).to_bytes(2, "big"))
    assert blob[11 : 11 + HEADER] == header
    assert blob[11 + HEADER : 43 + HEADER].hex() == keys.job_key.public().sha256()
    assert blob[43 + HEADER : 75 + HEADER].hex() == fingerprint(keys.sender)
    assert len(blob) == PREFIX + ENC_BYTES + 3 + 16 + SIGNATURE_BYTES
    assert ENC_BYTES == 1120 and SIGNATURE_BYTES == 3309 and OVERHEAD_BYTES == 4520
    # The middle is plain RFC 9180 HPKE with the prefix as info: any implementation opens it.
    middle = blob[PREFIX:-SIGNATURE_BYTES]
    assert SUITE.decrypt(middle, keys.job_key.hpke(), info=blob[:PREFIX]) == b"abc"


texts = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=40)
contexts = st.builds(
    SealContext,
    job=texts,
    round=st.integers(min_value=0, max_value=2**63 - 1),
    sender=texts,
    recipient=texts,
    purpose=st.sampled_from(["handoff", "final"]),
)


@settings(max_examples=25, deadline=None)
@given(plaintext=st.binary(max_size=2048), context=contexts)
def test_round_trip_property(keys, plaintext, context):
    assert opened(keys, sealed(keys, plaintext, context), context) == plaintext


# --- who can open a blob, and who can seal one --------------------------------------------


def test_another_per_job_key_cannot_open_it(keys):
    """Another key of the same hospital (an older job's, or one a coordinator made)."""
    blob = sealed(keys)
    other = RecipientKey.generate()
    with pytest.raises(SealError, match="sealed to another recipient key") as info:
        unseal(blob, recipient=other, sender=keys.sender.public_key(), context=CONTEXT)
    assert "swapped or stale key" in str(info.value)


def test_a_blob_from_a_third_party_is_refused(keys):
    """C seals for B in A's name: it signs with its own identity, not A's."""
    forger = generate_identity_key()
    forged = seal(
        b"evil",
        sender=forger,
        recipient=published(keys),
        recipient_identity=keys.recipient.public_key(),
        context=CONTEXT,
    )
    with pytest.raises(SealError, match="not the one pinned for 'hosp-a'") as info:
        opened(keys, forged)
    assert format_fingerprint(fingerprint(forger)) in str(info.value)
    # Naming A's fingerprint instead, C cannot make A's signature.
    start = 43 + HEADER
    pretending = forged[:start] + bytes.fromhex(fingerprint(keys.sender)) + forged[start + 32 :]
    with pytest.raises(SealError, match=f"{AUTH_FAILURE} \\(its signature does not verify\\)"):
        opened(keys, resigned(pretending, forger))


def test_the_wrong_sender_identity_is_refused(keys):
    blob = sealed(keys)
    other = generate_identity_key()
    with pytest.raises(SealError, match="not the one pinned"):
        unseal(blob, recipient=keys.job_key, sender=other.public_key(), context=CONTEXT)


def test_a_wrong_signature_is_refused(keys):
    blob = sealed(keys)
    with pytest.raises(SealError, match="its signature does not verify"):
        opened(keys, resigned(blob, generate_identity_key()))
    with pytest.raises(SealError, match="its signature does not verify"):
        opened(keys, blob[:-SIGNATURE_BYTES] + bytes(SIGNATURE_BYTES))


def test_a_blob_re_signed_by_a_third_party_does_not_open_in_its_name(keys):
    """C strips A's signature and signs A's blob as its own: told the blob is C's, B still
    cannot open it, since the context and the sender's identity are in the HPKE info."""
    thief = generate_identity_key()
    blob = sealed(keys)
    as_thief = dataclasses.replace(CONTEXT, sender="hosp-c")
    header, thief_header = CONTEXT.canonical_bytes(), as_thief.canonical_bytes()
    start = 43 + HEADER
    stolen = blob.replace(header, thief_header, 1)
    stolen = stolen[:start] + bytes.fromhex(fingerprint(thief)) + stolen[start + 32 :]
    with pytest.raises(SealError, match=f"{AUTH_FAILURE} \\(it does not decrypt"):
        unseal(
            resigned(stolen, thief),
            recipient=keys.job_key,
            sender=thief.public_key(),
            context=as_thief,
        )


def test_what_the_coordinator_knows_is_not_enough(keys):
    """Every public key, the context and the blob do not open it, however they are used."""
    blob = sealed(keys, b"secret state")
    public = keys.job_key.public().raw
    # The public key's bytes misused as a private key (a seed and an X25519 scalar).
    misused = RecipientKey.from_bytes(public[:64] + public[-32:])
    fresh = RecipientKey.generate()
    for key in (misused, fresh):
        with pytest.raises(SealError):
            unseal(blob, recipient=key, sender=keys.sender.public_key(), context=CONTEXT)
        # Even skipping every check of unseal, HPKE itself refuses.
        with pytest.raises(InvalidTag):
            SUITE.decrypt(blob[PREFIX:-SIGNATURE_BYTES], key.hpke(), info=blob[:PREFIX])


def test_a_blob_cannot_be_reflected_back_to_its_sender(keys):
    blob = sealed(keys)
    reflected = dataclasses.replace(CONTEXT, sender=CONTEXT.recipient, recipient=CONTEXT.sender)
    with pytest.raises(SealError, match="replayed or misplaced"):
        opened(keys, blob, reflected)
    header, forged_header = CONTEXT.canonical_bytes(), reflected.canonical_bytes()
    assert len(header) == len(forged_header)
    with pytest.raises(SealError, match=AUTH_FAILURE):
        opened(keys, blob.replace(header, forged_header, 1), reflected)


def test_authentication_failure_message_names_both_causes_and_no_secrets(keys):
    plaintext = b"PLAINTEXT-MARKER"
    blob = bytearray(sealed(keys, plaintext))
    blob[PREFIX + 5] ^= 1
    with pytest.raises(SealError) as info:
        opened(keys, bytes(blob))
    message = str(info.value)
    assert "altered" in message and "not sealed by" in message
    for secret in (keys.job_key.to_bytes(), identity_key_to_bytes(keys.sender)):
        assert secret.hex() not in message
        assert base64.b64encode(secret).decode() not in message
    assert "PLAINTEXT-MARKER" not in message


# --- recipient keys: only a key its owner signed, for this job and hospital -------------


def test_an_unsigned_recipient_key_is_refused(keys):
    unsigned = dataclasses.replace(published(keys), signature=b"")
    with pytest.raises(SealError, match="is not signed"):
        seal(
            b"x",
            sender=keys.sender,
            recipient=unsigned,
            recipient_identity=keys.recipient.public_key(),
            context=CONTEXT,
        )
    as_published = {"key": keys.job_key.public().b64()}
    with pytest.raises(SealError, match="is not signed"):
        SignedRecipientKey.from_json(job="job-3", hospital="hosp-b", data=as_published)
    with pytest.raises(SealError, match="has published no recipient key for 'job-3' yet"):
        SignedRecipientKey.from_json(job="job-3", hospital="hosp-b", data=None)


def test_a_recipient_key_not_signed_by_the_pinned_identity_is_refused(keys):
    """A coordinator's own key, signed by the coordinator's own identity for hosp-b."""
    impostor = generate_identity_key()
    swapped = SignedRecipientKey.sign(
        job="job-3", hospital="hosp-b", key=RecipientKey.generate().public(), identity=impostor
    )
    with pytest.raises(SealError, match="not signed by its pinned identity key") as info:
        seal(
            b"x",
            sender=keys.sender,
            recipient=swapped,
            recipient_identity=keys.recipient.public_key(),
            context=CONTEXT,
        )
    assert format_fingerprint(fingerprint(keys.recipient)) in str(info.value)


@pytest.mark.parametrize(("job", "hospital"), [("job-4", "hosp-b"), ("job-3", "hosp-c")])
def test_a_recipient_key_signed_for_another_job_or_hospital_is_refused(keys, job, hospital):
    other = SignedRecipientKey.sign(
        job=job, hospital=hospital, key=keys.job_key.public(), identity=keys.recipient
    )
    with pytest.raises(SealError, match="refusing to seal to it"):
        seal(
            b"x",
            sender=keys.sender,
            recipient=other,
            recipient_identity=keys.recipient.public_key(),
            context=CONTEXT,
        )
    # Relabelled as this job's and hospital's, its signature no longer verifies.
    relabelled = dataclasses.replace(other, job="job-3", hospital="hosp-b")
    with pytest.raises(SealError, match="not signed by its pinned identity key"):
        relabelled.verify(keys.recipient.public_key())


def test_a_published_recipient_key_round_trips_as_json(keys):
    signed = published(keys)
    again = SignedRecipientKey.from_json(job="job-3", hospital="hosp-b", data=signed.to_json())
    assert again == signed
    assert again.verify(keys.recipient.public_key()) == keys.job_key.public()


# --- tampering --------------------------------------------------------------------------


def test_single_byte_flips_are_rejected(keys):
    context = SealContext(job="j", round=1, sender="a", recipient="b")
    blob = sealed(keys, b"short", context)
    prefix = 11 + len(context.canonical_bytes()) + 64
    # Every byte of the prefix with several masks; the rest sampled (each costs a verify).
    positions = [*range(prefix), *range(prefix, len(blob), 37), len(blob) - 1]
    for position in positions:
        for mask in (0x01, 0x80, 0xFF) if position < prefix else (0x01,):
            tampered = bytearray(blob)
            tampered[position] ^= mask
            with pytest.raises(SealError):
                opened(keys, bytes(tampered), context)


def test_every_truncation_and_an_extension_are_rejected(keys):
    context = SealContext(job="j", round=1, sender="a", recipient="b")
    blob = sealed(keys, b"short", context)
    for length in range(len(blob)):
        with pytest.raises(SealError):
            opened(keys, blob[:length], context)
    with pytest.raises(SealError, match=AUTH_FAILURE):
        opened(keys, blob + b"\x00", context)


def test_rewriting_the_header_to_the_expected_context_fails_authentication(keys):
    blob = sealed(keys, b"state")
    later = dataclasses.replace(CONTEXT, round=1)
    rewritten = blob.replace(CONTEXT.canonical_bytes(), later.canonical_bytes(), 1)
    with pytest.raises(SealError, match="its signature does not verify"):
        opened(keys, rewritten, later)


def test_a_non_canonical_header_is_rejected(keys):
    blob = sealed(keys, b"state")
    header = CONTEXT.canonical_bytes()
    spaced = header.replace(b":", b": ", 1)  # same values, other bytes
    prefix = MAGIC + bytes([FORMAT_VERSION]) + len(spaced).to_bytes(2, "big")
    rewritten = prefix + spaced + blob[11 + len(header) :]
    with pytest.raises(SealError, match="non-canonical"):
        opened(keys, rewritten)


# --- replayed or misplaced blobs --------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("round", 1, "round 0 of job 'job-3', expected round 1"),
        ("job", "job-4", "job 'job-3', expected job 'job-4'"),
        ("recipient", "hosp-c", "recipient 'hosp-b' of job 'job-3', expected recipient 'hosp-c'"),
        ("sender", "hosp-c", "sender 'hosp-a' of job 'job-3', expected sender 'hosp-c'"),
        ("purpose", "final", "purpose 'handoff' of job 'job-3', expected purpose 'final'"),
    ],
)
def test_a_blob_for_another_context_is_rejected_naming_the_field(keys, field, value, shown):
    blob = sealed(keys)
    expected = dataclasses.replace(CONTEXT, **{field: value})
    with pytest.raises(SealError, match="replayed or misplaced") as info:
        opened(keys, blob, expected)
    assert f"sealed for {shown}" in str(info.value)
    assert f"({field} differs)" in str(info.value)


def test_a_mismatch_names_every_differing_field(keys):
    expected = dataclasses.replace(CONTEXT, round=5, recipient="hosp-c")
    with pytest.raises(SealError, match=r"\(round, recipient differ\)"):
        opened(keys, sealed(keys), expected)


# --- not a blob, versions, truncation ---------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"not sealed at all",
        b"\x00" * 100,
        b"PK\x03\x04 a zip file",
        b"X",
        b"MSPLSEAX" + b"\x02" * 80,
    ],
)
def test_bytes_that_are_not_a_blob_are_named_so(keys, data):
    with pytest.raises(SealError, match="not a sealed MedSplit blob"):
        opened(keys, data)


def test_unsealed_safetensors_bytes_are_not_a_blob(keys):
    header = b'{"__metadata__":{"format":"medsplit.handoff"}}'
    with pytest.raises(SealError, match="not a sealed MedSplit blob"):
        opened(keys, len(header).to_bytes(8, "little") + header)


@pytest.mark.parametrize("length", [0, 1, 7, 8, 10, 11, 50, 150, 1300, 4500])
def test_a_truncated_blob_is_named_so(keys, length):
    with pytest.raises(SealError, match="truncated"):
        opened(keys, sealed(keys)[:length])


def test_a_legacy_x25519_blob_is_named_so(keys):
    blob = bytearray(sealed(keys))
    blob[len(MAGIC)] = 1
    with pytest.raises(SealError, match="static X25519 keys of earlier MedSplit releases"):
        opened(keys, bytes(blob))


def test_an_unsupported_version_is_named_so(keys):
    blob = bytearray(sealed(keys))
    blob[len(MAGIC)] = FORMAT_VERSION + 1
    with pytest.raises(SealError, match=f"format version {FORMAT_VERSION + 1}.*reads version 2"):
        opened(keys, bytes(blob))


def test_seal_errors_belong_to_the_hierarchy():
    assert issubclass(SealError, MedSplitError)
    assert issubclass(SealError, ValueError)


def test_wrong_argument_types_are_type_errors(keys):
    public = keys.recipient.public_key()
    with pytest.raises(TypeError, match="SignedRecipientKey"):
        seal(
            b"x",
            sender=keys.sender,
            recipient=keys.job_key.public(),
            recipient_identity=public,
            context=CONTEXT,
        )
    with pytest.raises(TypeError, match="MLDSA65PrivateKey"):
        seal(
            b"x",
            sender=X25519PrivateKey.generate(),
            recipient=published(keys),
            recipient_identity=public,
            context=CONTEXT,
        )
    with pytest.raises(TypeError, match="SealContext"):
        seal(
            b"x",
            sender=keys.sender,
            recipient=published(keys),
            recipient_identity=public,
            context=object(),
        )
    with pytest.raises(TypeError, match="bytes"):
        seal(
            "text",
            sender=keys.sender,
            recipient=published(keys),
            recipient_identity=public,
            context=CONTEXT,
        )
    with pytest.raises(TypeError, match="RecipientKey"):
        unseal(b"x", recipient=keys.job_key.public(), sender=public, context=CONTEXT)
    with pytest.raises(TypeError, match="MLDSA65PublicKey"):
        unseal(b"x", recipient=keys.job_key, sender=keys.sender, context=CONTEXT)


# --- contexts ---------------------------------------------------------------------------


def test_canonical_bytes_are_compact_sorted_ascii_json():
    context = SealContext(job="jöb", round=2, sender="a", recipient="b", purpose="final")
    assert context.canonical_bytes() == (
        b'{"job":"j\\u00f6b","purpose":"final","recipient":"b","round":2,"sender":"a"}'
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"job": ""}, "job must not be empty"),
        ({"sender": "a\nb"}, "sender .* control characters"),
        ({"recipient": "b\x00"}, "recipient .* control characters"),
        ({"job": "\ud800"}, "job .* lone surrogates"),
        ({"job": 3}, "job must be a string"),
        ({"sender": "x" * 257}, "sender has 257 characters"),
        ({"round": -1}, "round must be between 0"),
        ({"round": 2**63}, "round must be between 0"),
        ({"round": True}, "round must be an integer"),
        ({"round": 1.0}, "round must be an integer"),
        ({"purpose": "other"}, "purpose must be one of"),
    ],
)
def test_invalid_contexts_are_refused(changes, message):
    fields = {"job": "job-3", "round": 0, "sender": "a", "recipient": "b", **changes}
    with pytest.raises(SealError, match=message):
        SealContext(**fields)


def test_contexts_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        CONTEXT.round = 1  # type: ignore[misc]


# --- keys -------------------------------------------------------------------------------


def test_identity_key_seed_round_trips(keys):
    raw = identity_key_to_bytes(keys.sender)
    assert len(raw) == 32
    restored = identity_key_from_bytes(raw)
    assert fingerprint(restored) == fingerprint(keys.sender)
    blob = sealed(keys)
    assert unseal(blob, recipient=keys.job_key, sender=restored.public_key(), context=CONTEXT)


@pytest.mark.parametrize("length", [0, 31, 33, 64])
def test_an_identity_key_of_wrong_length_is_refused(length):
    with pytest.raises(SealError, match=f"32-byte seed, this one has {length} bytes"):
        identity_key_from_bytes(b"\x01" * length)


def test_identity_public_key_base64_round_trip(keys):
    text = identity_public_b64(keys.sender)
    assert text == identity_public_b64(keys.sender.public_key())
    assert len(base64.b64decode(text)) == 1952
    assert fingerprint(identity_public_from_b64(text)) == fingerprint(keys.sender)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not base64!", "not valid standard base64"),
        ("é" * 10, "not valid standard base64"),
        (base64.b64encode(b"\x01" * 1951).decode(), "this base64 decodes to 1951"),
        (base64.b64encode(bytes(32)).decode(), "this base64 decodes to 32"),  # an X25519 key
        ("", "this base64 decodes to 0"),
        ("A" * 5000, "2604 characters of base64, this text has 5000"),
    ],
)
def test_bad_identity_public_keys_are_clear_errors(text, message):
    with pytest.raises(SealError, match=message):
        identity_public_from_b64(text)


def test_fingerprints_are_sha256_shown_in_groups_of_four(keys):
    digits = fingerprint(keys.sender)
    assert digits == hashlib.sha256(keys.sender.public_key().public_bytes_raw()).hexdigest()
    shown = format_fingerprint(digits)
    assert shown.split() == [digits[i : i + 4] for i in range(0, 64, 4)]
    assert format_fingerprint(shown.upper()) == shown, "a fingerprint read back is the same"
    for bad in ("", "abc", digits[:-1] + "g", 5):
        with pytest.raises(SealError, match="64 hex digits"):
            format_fingerprint(bad)  # type: ignore[arg-type]


def test_recipient_keys_round_trip_as_bytes_and_base64(keys):
    restored = RecipientKey.from_bytes(keys.job_key.to_bytes())
    assert len(keys.job_key.to_bytes()) == 96
    assert restored.public() == keys.job_key.public()
    public = keys.job_key.public()
    assert len(public.raw) == RECIPIENT_PUBLIC_BYTES == 1216
    assert RecipientPublicKey.from_b64(public.b64()) == public
    assert opened(Keys(keys.sender, keys.recipient, restored), sealed(keys)) == b"training state"
    with pytest.raises(SealError, match=r"has 96 bytes .* this one has 95"):
        RecipientKey.from_bytes(b"\x01" * 95)


def test_bad_recipient_public_keys_are_clear_errors(keys):
    good = keys.job_key.public().raw
    with pytest.raises(SealError, match=r"has 1216 bytes .* this one has 32"):
        RecipientPublicKey.from_bytes(good[-32:])  # a bare X25519 key, as before
    with pytest.raises(SealError, match="X25519 part is not usable"):
        RecipientPublicKey.from_bytes(good[:-32] + bytes(32))
    with pytest.raises(SealError, match="ML-KEM-768 part is not a usable key"):
        RecipientPublicKey.from_bytes(b"\xff" * 1184 + good[-32:])
    with pytest.raises(SealError, match="not valid standard base64"):
        RecipientPublicKey.from_b64("!!")
