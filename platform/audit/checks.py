"""``manage.py check --deploy``: audit rows signed with a key that the database's owner
could derive are not proof against that owner."""

from __future__ import annotations

from typing import Any

from django.core import checks

from audit.macs import is_derived


@checks.register(checks.Tags.security, deploy=True)
def audit_mac_key_is_set(**_: Any) -> list[checks.CheckMessage]:
    """Without MEDSPLIT_AUDIT_MAC_KEYS the rows' MACs use a key derived from the secret key,
    which whoever reads the coordinator's settings holds too."""
    if not is_derived():
        return []
    return [
        checks.Warning(
            "MEDSPLIT_AUDIT_MAC_KEYS is not set: audit rows are signed with a key derived "
            "from MEDSPLIT_SECRET_KEY",
            hint="set MEDSPLIT_AUDIT_MAC_KEYS=k1:<python3 -c 'import base64, secrets; "
            "print(base64.b64encode(secrets.token_bytes(32)).decode())'> and keep it out of "
            "the database's reach (docs/deploy.md, The audit log)",
            id="audit.W001",
        )
    ]
