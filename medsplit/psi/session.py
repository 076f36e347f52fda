"""One two-party private set intersection: the client learns the intersection, the server
only the client's set size.

The client is the label party; it runs one session with each other party. Both sides
take the session name from what the coordinator scheduled (the job and the pair), never
from a message. The ECDH protocol is OpenMined's ``openmined-psi`` (P-256, each side a
fresh secret key per session), with ``reveal_intersection`` set for the client::

    client                                   server
    request = H(x)^a for its x      ──►
                                    ◄──      setup = sorted H(y)^b for its y
                                    ◄──      response = (H(x)^a)^b, in the request's order
    intersection = the x whose (H(x)^ab)^(1/a) = H(x)^b is in the setup
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from medsplit.psi.errors import PsiError, PsiMessageError
from medsplit.psi.identifiers import check_identifiers
from medsplit.psi.messages import PsiRequest, PsiResponse, PsiSetup

if TYPE_CHECKING:
    import private_set_intersection.python as psi

__all__ = ["DEFAULT_FALSE_POSITIVE_RATE", "PsiClient", "PsiServer", "ServerReply"]


def _library() -> ModuleType:
    """``openmined-psi``, imported at first use: with protobuf it is 4 MiB resident that
    only a vertical job's parties need (every agent imports this package)."""
    return importlib.import_module("private_set_intersection.python")


DEFAULT_FALSE_POSITIVE_RATE = 1e-9
"""For a ``gcs`` setup: the chance that the whole run counts one identifier it should not."""

# The library keeps a Golomb set's hash range as a signed 64-bit integer, and it is
# client size x server size / false-positive rate: past 2^63 it wraps around silently.
_HASH_RANGE_LIMIT = 2**63


@dataclass(frozen=True)
class ServerReply:
    """What the server sends back, both as bytes."""

    setup: bytes
    response: bytes


class PsiClient:
    """The label party's side of one session.

    Args:
        identifiers: its identifiers (checked: distinct, well formed, bounded).
        session: the session's name (job and pair), the same on both sides.
    """

    def __init__(self, identifiers: Sequence[str], *, session: str) -> None:
        self.identifiers = check_identifiers(identifiers, source=f"client of {session}")
        self.session = session
        self._psi = _library().client.CreateWithNewKey(True)
        self._request: PsiRequest | None = None

    def request(self) -> bytes:
        """The request message (made once; asking again gives the same bytes)."""
        if self._request is None:
            proto = self._psi.CreateRequest(list(self.identifiers))
            self._request = PsiRequest(self.session, b"".join(proto.encrypted_elements))
        return self._request.to_bytes()

    def intersect(self, reply: ServerReply) -> tuple[str, ...]:
        """The identifiers both sides hold, in this side's order.

        Raises:
            PsiMessageError: the reply is malformed, of another session or request, or
                does not answer every point of the request.
        """
        if self._request is None:
            raise PsiError("send the request before reading a reply")
        answers = self._request.digest()
        setup = PsiSetup.from_bytes(reply.setup, session=self.session, answers=answers)
        response = PsiResponse.from_bytes(reply.response, session=self.session, answers=answers)
        if response.count != self._request.count:
            raise PsiMessageError(
                f"PSI response holds {response.count:,} points for a request of "
                f"{self._request.count:,}"
            )
        try:
            indices = self._psi.GetIntersection(_setup_proto(setup), _response_proto(response))
        except RuntimeError as exc:  # the library's own refusal of a point or set
            raise PsiMessageError(f"PSI reply refused by openmined-psi: {exc}") from exc
        return tuple(self.identifiers[i] for i in sorted(indices))


class PsiServer:
    """The other party's side of one session.

    Args:
        identifiers: its identifiers (checked: distinct, well formed, bounded).
        session: the session's name (job and pair), the same on both sides.
        structure: ``raw`` (exact: every blinded identifier, 33 bytes each) or ``gcs``
            (a Golomb-compressed set, a few bytes each, wrong with ``false_positive_rate``).
        false_positive_rate: for ``gcs`` only.

    Attributes:
        client_size: the client's set size, once a request was answered (all it learns).
    """

    def __init__(
        self,
        identifiers: Sequence[str],
        *,
        session: str,
        structure: str = "raw",
        false_positive_rate: float = DEFAULT_FALSE_POSITIVE_RATE,
    ) -> None:
        if structure not in ("raw", "gcs"):
            raise PsiError(f"PSI setup structure {structure!r} is not raw or gcs")
        if not 0 < false_positive_rate < 1:
            raise PsiError(f"false-positive rate {false_positive_rate} is not in (0, 1)")
        self.identifiers = check_identifiers(identifiers, source=f"server of {session}")
        self.session = session
        self.structure = structure
        self.false_positive_rate = false_positive_rate
        self.client_size: int | None = None
        self._psi = _library().server.CreateWithNewKey(True)

    def answer(self, request: bytes) -> ServerReply:
        """The setup and response for the client's ``request``.

        Raises:
            PsiMessageError: the request is malformed, of another session, or holds a
                point that is not on the curve.
            PsiError: a ``gcs`` setup this large needs a larger false-positive rate.
        """
        parsed = PsiRequest.from_bytes(request, session=self.session)
        proto = _library().Request(reveal_intersection=True, encrypted_elements=parsed.elements())
        try:
            response = self._psi.ProcessRequest(proto)
        except RuntimeError as exc:
            raise PsiMessageError(f"PSI request refused by openmined-psi: {exc}") from exc
        answers = parsed.digest()
        self.client_size = parsed.count
        setup = self._setup(parsed.count, answers)
        reply = PsiResponse(self.session, answers, b"".join(response.encrypted_elements))
        return ServerReply(setup.to_bytes(), reply.to_bytes())

    def _setup(self, client_size: int, answers: bytes) -> PsiSetup:
        rate = self.false_positive_rate
        if self.structure == "raw":
            proto = self._psi.CreateSetupMessage(
                rate, client_size, list(self.identifiers), _library().DataStructure.RAW
            )
            points = b"".join(sorted(proto.raw.encrypted_elements))
            return PsiSetup(self.session, answers, "raw", points=points)
        if client_size * len(self.identifiers) / rate >= _HASH_RANGE_LIMIT:
            raise PsiError(
                f"a gcs setup for {client_size:,} x {len(self.identifiers):,} identifiers "
                f"at a false-positive rate of {rate:g} overflows openmined-psi's hash "
                f"range; use a rate of at least "
                f"{client_size * len(self.identifiers) / (_HASH_RANGE_LIMIT - 1):.2g} "
                "or the raw structure"
            )
        proto = self._psi.CreateSetupMessage(
            rate, client_size, list(self.identifiers), _library().DataStructure.GCS
        )
        gcs = proto.gcs
        return PsiSetup(
            self.session, answers, "gcs", div=gcs.div, hash_range=gcs.hash_range, bits=gcs.bits
        )


def _setup_proto(setup: PsiSetup) -> psi.ServerSetup:
    proto = _library().ServerSetup()
    if setup.structure == "raw":
        proto.raw.encrypted_elements.extend(setup.elements())
    else:
        proto.gcs.div = setup.div
        proto.gcs.hash_range = setup.hash_range
        proto.gcs.bits = setup.bits
    return proto


def _response_proto(response: PsiResponse) -> psi.Response:
    return _library().Response(encrypted_elements=response.elements())
