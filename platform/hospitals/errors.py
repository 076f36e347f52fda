"""Errors of enrolment and relay provisioning, in the platform's one hierarchy.

An enrolment code that cannot be used gets one clear error each, and changes nothing:

=================  ======  ============================  =====================================
case               status  code                          meaning
=================  ======  ============================  =====================================
malformed          400     ``invalid``                   not ``msc_<key id>_<secret>`` at all
unknown            404     ``enrolment_code_unknown``    no such code (or a wrong secret)
used               410     ``enrolment_code_used``       already exchanged for a token
revoked            410     ``enrolment_code_revoked``    replaced by a newer code, or the
                                                         hospital was rejected or its access
                                                         revoked
expired            410     ``enrolment_code_expired``    older than ENROLMENT_CODE_TTL_SECONDS
=================  ======  ============================  =====================================
"""

from __future__ import annotations

from kernel.errors import Gone, NotFound, PlatformError


class EnrolmentCodeUnknown(NotFound):
    code = "enrolment_code_unknown"


class EnrolmentCodeUsed(Gone):
    code = "enrolment_code_used"


class EnrolmentCodeRevoked(Gone):
    code = "enrolment_code_revoked"


class EnrolmentCodeExpired(Gone):
    code = "enrolment_code_expired"


class RelayProvisioningFailed(PlatformError):
    """The relay's ACL user could not be created or removed; nothing was changed."""

    code = "relay_provisioning_failed"
    status = 503
