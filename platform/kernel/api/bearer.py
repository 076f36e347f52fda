"""``Authorization: Bearer <token>``, read the same way for every token the coordinator
takes: an agent's token and the metrics scraper's."""

from __future__ import annotations

from rest_framework import authentication, exceptions
from rest_framework.request import Request

KEYWORD = "Bearer"


def bearer_token(request: Request) -> bytes | None:
    """The token the request presents, or ``None`` when it presents none (another
    authentication, a session, may then apply).

    Raises:
        AuthenticationFailed: the header says Bearer but is not ``Bearer <token>``.
    """
    header = authentication.get_authorization_header(request).split()
    if not header or header[0].lower() != KEYWORD.lower().encode():
        return None
    if len(header) != 2:
        raise exceptions.AuthenticationFailed("malformed Authorization header")
    return header[1]
