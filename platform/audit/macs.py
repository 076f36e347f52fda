"""Each audit row's MAC: proof that the coordinator wrote it, against the database's owner.

The hash chain shows a row changed or removed *unless* whoever did it rewrote every later
hash and the head; the owner of the database can do exactly that, and can insert a
correctly chained row with SQL. So every row also carries an HMAC-SHA256 of its hash under
a key the database never holds (``MEDSPLIT_AUDIT_MAC_KEYS``, from the coordinator's
environment): a row written or rewritten with SQL has no valid MAC, and
``manage.py audit_verify`` names it.

Keys are rotatable: the setting lists ``<id>:<base64 of 32 random bytes>`` entries, the
first signing new rows, every one still checking the rows it signed (each row keeps its
key's id). Without the setting (the embedded mode) a key derived from
``MEDSPLIT_SECRET_KEY`` is used under the id ``derived``; ``check --deploy`` warns.

What a MAC cannot show is a tail removed and the head rewound to an older row (the
remaining rows keep their valid MACs): the hospitals catch that, by witnessing the head
(``audit.witness``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

DERIVED = "derived"
_LABEL = b"medsplit audit row mac v1\x00"
_KEY_BYTES = 32


@dataclass(frozen=True)
class MacKeys:
    """The signing key's id, and every key by id."""

    current: str
    keys: dict[str, bytes]

    def mac(self, row_hash: str, key_id: str | None = None) -> str:
        """The MAC of a row whose hash is ``row_hash``, under ``key_id`` (the current key
        when ``None``). Raises ``KeyError`` for an unknown id."""
        key = self.keys[key_id or self.current]
        return hmac.new(key, _LABEL + row_hash.encode("ascii"), hashlib.sha256).hexdigest()

    def verifies(self, row_hash: str, key_id: str, mac: str) -> bool:
        """Whether ``mac`` is the MAC of ``row_hash`` under the key ``key_id``."""
        if key_id not in self.keys or not mac:
            return False
        return hmac.compare_digest(self.mac(row_hash, key_id), mac)


def mac_keys() -> MacKeys:
    """The configured keys (``settings.MEDSPLIT["AUDIT_MAC_KEYS"]``).

    Raises:
        ImproperlyConfigured: the setting is malformed (names the entry).
    """
    text = settings.MEDSPLIT.get("AUDIT_MAC_KEYS", "")
    return _parse(text) if text.strip() else _derived()


def is_derived() -> bool:
    """Whether rows are signed with the key derived from the secret key (embedded mode)."""
    return mac_keys().current == DERIVED


def _derived() -> MacKeys:
    key = hashlib.sha256(b"medsplit audit mac key\x00" + settings.SECRET_KEY.encode()).digest()
    return MacKeys(DERIVED, {DERIVED: key})


def _parse(text: str) -> MacKeys:
    keys: dict[str, bytes] = {}
    order: list[str] = []
    for entry in (e.strip() for e in text.split(",")):
        key_id, sep, encoded = entry.partition(":")
        if not sep or not key_id or not key_id.isalnum() or len(key_id) > 16:
            raise ImproperlyConfigured(
                "MEDSPLIT_AUDIT_MAC_KEYS entries must read <id>:<base64 key> with an id of "
                f"1-16 letters and digits; got an entry starting {entry[:8]!r}"
            )
        try:
            key = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ImproperlyConfigured(
                f"MEDSPLIT_AUDIT_MAC_KEYS: the key of {key_id!r} is not base64"
            ) from None
        if len(key) < _KEY_BYTES:
            raise ImproperlyConfigured(
                f"MEDSPLIT_AUDIT_MAC_KEYS: the key of {key_id!r} has {len(key)} bytes; use "
                f"{_KEY_BYTES} random ones (python3 -c 'import base64, secrets; "
                "print(base64.b64encode(secrets.token_bytes(32)).decode())')"
            )
        if key_id in keys:
            raise ImproperlyConfigured(f"MEDSPLIT_AUDIT_MAC_KEYS names {key_id!r} twice")
        keys[key_id] = key
        order.append(key_id)
    return MacKeys(order[0], keys)
