"""Sealing hand-offs: only the recipient opens them, and only for the context it expects.

Real cryptography throughout, no mocks.
"""

from __future__ import annotations

import base64
import dataclasses
import os

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from hypothesis import given, settings
from hypothesis import strategies as st

from medsplit.errors import MedSplitError, SealError
from medsplit.protocol.sealing import (
    FORMAT_VERSION,
    MAGIC,
    SealContext,
    generate_private_key,
    private_key_from_bytes,
    private_key_to_bytes,
    public_key_b64,
    public_key_from_b64,
    seal,
    unseal,
)

AUTH_FAILURE = "failed authentication"
CONTEXT = SealContext(job="job-3", round=0, sender="hosp-a", recipient="hosp-b")


@pytest.fixture(scope="module")
def keys() -> tuple[X25519PrivateKey, X25519PrivateKey]:
    """The sender's and the recipient's private keys."""
    return generate_private_key(), generate_private_key()


def sealed(keys, plaintext: bytes = b"training state", context: SealContext = CONTEXT) -> bytes:
    sender, recipient = keys
    return seal(plaintext, sender=sender, recipient=recipient.public_key(), context=context)


def opened(keys, blob: bytes, context: SealContext = CONTEXT) -> bytes:
    sender, recipient = keys
    return unseal(blob, recipient=recipient, sender=sender.public_key(), context=context)


def raw_public(key: X25519PrivateKey) -> bytes:
    return base64.b64decode(public_key_b64(key))


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
    assert len(blob) == len(payload) + 8 + 1 + 2 + len(CONTEXT.canonical_bytes()) + 32 + 12 + 16
    assert opened(keys, blob) == payload


def test_final_purpose_round_trips(keys):
    final = dataclasses.replace(CONTEXT, purpose="final")
    assert opened(keys, sealed(keys, b"final", final), final) == b"final"


def test_two_seals_of_the_same_plaintext_differ(keys):
    first, second = sealed(keys, b"same"), sealed(keys, b"same")
    assert first != second
    header = 8 + 1 + 2 + len(CONTEXT.canonical_bytes())
    assert first[header : header + 32] != second[header : header + 32]  # salt
    assert first[header + 32 : header + 44] != second[header + 32 : header + 44]  # nonce
    assert opened(keys, first) == opened(keys, second) == b"same"


def test_ciphertext_does_not_hold_the_plaintext(keys):
    secret = b"patient-0042 " * 64
    blob = sealed(keys, secret)
    assert b"patient-0042" not in blob


def test_blob_layout(keys):
    blob = sealed(keys, b"abc")
    header = CONTEXT.canonical_bytes()
    assert blob.startswith(MAGIC + bytes([FORMAT_VERSION]) + len(header).to_bytes(2, "big"))
    assert blob[11 : 11 + len(header)] == header
    assert len(blob) == 11 + len(header) + 32 + 12 + 3 + 16


texts = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=40)
contexts = st.builds(
    SealContext,
    job=texts,
    round=st.integers(min_value=0, max_value=2**63 - 1),
    sender=texts,
    recipient=texts,
    purpose=st.sampled_from(["handoff", "final"]),
)


@settings(max_examples=60, deadline=None)
@given(plaintext=st.binary(max_size=2048), context=contexts)
def test_round_trip_property(keys, plaintext, context):
    assert opened(keys, sealed(keys, plaintext, context), context) == plaintext


# --- who can open a blob ----------------------------------------------------------------


def test_a_third_partys_private_key_fails(keys):
    sender, _ = keys
    blob = sealed(keys)
    with pytest.raises(SealError, match=AUTH_FAILURE):
        unseal(blob, recipient=generate_private_key(), sender=sender.public_key(), context=CONTEXT)


def test_the_wrong_sender_key_fails(keys):
    _, recipient = keys
    blob = sealed(keys)
    forger = generate_private_key()
    with pytest.raises(SealError, match=AUTH_FAILURE):
        unseal(blob, recipient=recipient, sender=forger.public_key(), context=CONTEXT)


def test_a_third_party_cannot_forge_a_blob_from_the_sender(keys):
    sender, recipient = keys
    forger = generate_private_key()
    forged = seal(b"evil", sender=forger, recipient=recipient.public_key(), context=CONTEXT)
    with pytest.raises(SealError, match=AUTH_FAILURE):
        unseal(forged, recipient=recipient, sender=sender.public_key(), context=CONTEXT)


def test_what_the_coordinator_knows_is_not_enough(keys):
    """Both public keys, the context and the blob do not open it, however they are used."""
    sender, recipient = keys
    blob = sealed(keys, b"secret state")
    sender_pub, recipient_pub = sender.public_key(), recipient.public_key()
    # The public keys misused as private scalars (X25519 clamps any 32 bytes into one).
    from_sender_pub = X25519PrivateKey.from_private_bytes(raw_public(sender))
    from_recipient_pub = X25519PrivateKey.from_private_bytes(raw_public(recipient))
    fresh = generate_private_key()
    attempts = [
        (fresh, sender_pub),
        (fresh, recipient_pub),
        (fresh, fresh.public_key()),
        (from_recipient_pub, sender_pub),
        (from_sender_pub, recipient_pub),
        (from_recipient_pub, recipient_pub),
        (from_sender_pub, sender_pub),
        (from_sender_pub, from_recipient_pub.public_key()),
        (from_recipient_pub, from_sender_pub.public_key()),
    ]
    for private, public in attempts:
        with pytest.raises(SealError, match=AUTH_FAILURE):
            unseal(blob, recipient=private, sender=public, context=CONTEXT)


def test_a_blob_cannot_be_reflected_back_to_its_sender(keys):
    """X25519 gives both parties the same secret; the context's names keep directions apart."""
    sender, recipient = keys
    blob = sealed(keys)
    reflected = dataclasses.replace(CONTEXT, sender=CONTEXT.recipient, recipient=CONTEXT.sender)
    with pytest.raises(SealError, match="replayed or misplaced"):
        unseal(blob, recipient=sender, sender=recipient.public_key(), context=reflected)
    # Even with the header rewritten to the reflected context, authentication fails.
    header, forged_header = CONTEXT.canonical_bytes(), reflected.canonical_bytes()
    assert len(header) == len(forged_header)
    rewritten = blob.replace(header, forged_header, 1)
    with pytest.raises(SealError, match=AUTH_FAILURE):
        unseal(rewritten, recipient=sender, sender=recipient.public_key(), context=reflected)


def test_authentication_failure_message_names_both_causes_and_no_secrets(keys):
    sender, recipient = keys
    plaintext = b"PLAINTEXT-MARKER"
    blob = sealed(keys, plaintext)
    with pytest.raises(SealError) as info:
        unseal(blob, recipient=generate_private_key(), sender=sender.public_key(), context=CONTEXT)
    message = str(info.value)
    assert "altered" in message and "not sealed by" in message
    for secret in (private_key_to_bytes(recipient), private_key_to_bytes(sender)):
        assert secret.hex() not in message
        assert base64.b64encode(secret).decode() not in message
    assert "PLAINTEXT-MARKER" not in message


# --- tampering --------------------------------------------------------------------------


def test_every_single_byte_flip_is_rejected(keys):
    context = SealContext(job="j", round=1, sender="a", recipient="b")
    blob = sealed(keys, b"short", context)
    for position in range(len(blob)):
        for mask in (0x01, 0x80, 0xFF):
            tampered = bytearray(blob)
            tampered[position] ^= mask
            with pytest.raises(SealError):
                opened(keys, bytes(tampered), context)


def test_every_truncation_and_an_extension_are_rejected(keys):
    blob = sealed(keys, b"short", SealContext(job="j", round=1, sender="a", recipient="b"))
    context = SealContext(job="j", round=1, sender="a", recipient="b")
    for length in range(len(blob)):
        with pytest.raises(SealError):
            opened(keys, blob[:length], context)
    with pytest.raises(SealError, match=AUTH_FAILURE):
        opened(keys, blob + b"\x00", context)


def test_rewriting_the_header_to_the_expected_context_fails_authentication(keys):
    blob = sealed(keys, b"state")
    later = dataclasses.replace(CONTEXT, round=1)
    rewritten = blob.replace(CONTEXT.canonical_bytes(), later.canonical_bytes(), 1)
    with pytest.raises(SealError, match=AUTH_FAILURE):
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
    blob = sealed(keys)
    expected = dataclasses.replace(CONTEXT, round=5, recipient="hosp-c")
    with pytest.raises(SealError, match=r"\(round, recipient differ\)"):
        opened(keys, blob, expected)


# --- not a blob, versions, truncation ---------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"not sealed at all",
        b"\x00" * 100,
        b"PK\x03\x04 a zip file",
        b"X",
        b"MSPLSEAX" + b"\x01" * 80,
    ],
)
def test_bytes_that_are_not_a_blob_are_named_so(keys, data):
    with pytest.raises(SealError, match="not a sealed MedSplit blob"):
        opened(keys, data)


def test_unsealed_safetensors_bytes_are_not_a_blob(keys):
    # What a hand-off looks like when someone forgets to seal it: 8-byte length, JSON.
    header = b'{"__metadata__":{"format":"medsplit.handoff"}}'
    with pytest.raises(SealError, match="not a sealed MedSplit blob"):
        opened(keys, len(header).to_bytes(8, "little") + header)


@pytest.mark.parametrize("length", [0, 1, 7, 8, 10, 11, 50, 150])
def test_a_truncated_blob_is_named_so(keys, length):
    blob = sealed(keys)
    with pytest.raises(SealError, match="truncated"):
        opened(keys, blob[:length])


def test_an_unsupported_version_is_named_so(keys):
    blob = bytearray(sealed(keys))
    blob[len(MAGIC)] = FORMAT_VERSION + 1
    with pytest.raises(SealError, match=f"format version {FORMAT_VERSION + 1}.*reads version 1"):
        opened(keys, bytes(blob))


def test_seal_errors_belong_to_the_hierarchy():
    assert issubclass(SealError, MedSplitError)
    assert issubclass(SealError, ValueError)


def test_wrong_argument_types_are_type_errors(keys):
    sender, recipient = keys
    with pytest.raises(TypeError, match="X25519PublicKey"):
        seal(b"x", sender=sender, recipient=recipient, context=CONTEXT)
    with pytest.raises(TypeError, match="SealContext"):
        seal(b"x", sender=sender, recipient=recipient.public_key(), context=object())
    with pytest.raises(TypeError, match="bytes"):
        seal("text", sender=sender, recipient=recipient.public_key(), context=CONTEXT)
    with pytest.raises(TypeError, match="X25519PrivateKey"):
        unseal(b"x", recipient=recipient.public_key(), sender=sender.public_key(), context=CONTEXT)


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


def test_private_key_bytes_round_trip(keys):
    sender, recipient = keys
    raw = private_key_to_bytes(recipient)
    assert len(raw) == 32
    restored = private_key_from_bytes(raw)
    assert public_key_b64(restored) == public_key_b64(recipient)
    blob = sealed(keys)
    assert unseal(blob, recipient=restored, sender=sender.public_key(), context=CONTEXT)


@pytest.mark.parametrize("length", [0, 31, 33, 64])
def test_private_key_of_wrong_length_is_refused(length):
    with pytest.raises(SealError, match=f"has 32 bytes, this one has {length}"):
        private_key_from_bytes(b"\x01" * length)


def test_public_key_base64_round_trip(keys):
    sender, _ = keys
    text = public_key_b64(sender)
    assert text == public_key_b64(sender.public_key())
    assert len(text) == 44
    assert len(base64.b64decode(text)) == 32
    key = public_key_from_b64(text)
    assert isinstance(key, X25519PublicKey)
    assert public_key_b64(key) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not base64!", "not valid standard base64"),
        ("é" * 10, "not valid standard base64"),
        ("abc", "not valid standard base64"),  # bad padding
        (base64.b64encode(b"\x01" * 31).decode(), "this base64 decodes to 31"),
        (base64.b64encode(b"\x01" * 33).decode(), "this base64 decodes to 33"),
        ("", "this base64 decodes to 0"),
        ("A" * 100, "44 characters of base64, this text has 100"),
        (base64.b64encode(b"\x00" * 32).decode(), "small-order point"),
    ],
)
def test_bad_public_keys_are_clear_errors(text, message):
    with pytest.raises(SealError, match=message):
        public_key_from_b64(text)


def test_sealing_to_a_small_order_key_is_refused(keys):
    sender, _ = keys
    zero = X25519PublicKey.from_public_bytes(b"\x00" * 32)
    with pytest.raises(SealError, match="small-order point"):
        seal(b"x", sender=sender, recipient=zero, context=CONTEXT)
