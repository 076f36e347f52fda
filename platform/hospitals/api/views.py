"""Hospitals API: thin views that validate, call one selector or service, and render.

Permissions are enforced by the services and selectors (accounts/permissions.py); the
views only require a signed-in caller (or none, for join requests and enrolment).
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.authentication import SessionAuthentication
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.witness import MAX_LINKS
from hospitals import agent_witness, relay_services, selectors, services
from hospitals.api.serializers import (
    AgentHospitalSerializer,
    ChainLinksSerializer,
    EnrolmentCodeSerializer,
    EnrolmentSerializer,
    EnrolSerializer,
    HeartbeatSerializer,
    HospitalRegisterSerializer,
    HospitalSerializer,
    IdentityMoveSerializer,
    IdentitySerializer,
    IssuedTokenSerializer,
    JoinRequestAnswerSerializer,
    JoinRequestSerializer,
    RegistrationSerializer,
    RejectSerializer,
    RevocationSerializer,
    TokenMetadataSerializer,
    WitnessStatementSerializer,
)
from hospitals.authentication import AgentTokenAuthentication
from hospitals.models import Hospital
from kernel.actors import actor_from_request, client_ip
from kernel.api.errors_schema import error
from kernel.api.throttling import ScopedThrottle
from kernel.errors import InvalidInput
from kernel.permissions import (
    require_agent,
    require_consortium_admin,
    require_consortium_admin_on,
)

ERRORS = {
    400: error("invalid input: {code, message, details}"),
    401: error("not signed in, or a bad or revoked agent token"),
    403: error("your role may not do this"),
    404: error("no such hospital, or not yours"),
}
CONFLICT = {409: error("the hospital's status does not allow this")}
THROTTLED = {429: error("too many requests; see Retry-After")}


class HospitalListView(GenericAPIView):
    """``GET``: the hospitals you may see. ``POST``: register one (consortium admin)."""

    filter_backends: list = []
    serializer_class = HospitalSerializer

    @extend_schema(
        operation_id="hospitals_list",
        parameters=[
            OpenApiParameter("status", str, enum=Hospital.Status.values),
            OpenApiParameter("online", OpenApiTypes.BOOL),
        ],
        responses={200: HospitalSerializer(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        hospitals = selectors.hospital_list(
            actor=actor_from_request(request), filters=request.query_params
        )
        page = self.paginate_queryset(hospitals)
        return self.get_paginated_response(HospitalSerializer(page, many=True).data)

    @extend_schema(
        operation_id="hospitals_register",
        request=HospitalRegisterSerializer,
        responses={201: RegistrationSerializer, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        actor = actor_from_request(request)
        require_consortium_admin(actor, "register hospitals")  # before judging the input
        data = _valid(HospitalRegisterSerializer, request)
        registration = services.hospital_register(actor=actor, **data)
        return Response(RegistrationSerializer(registration).data, status=status.HTTP_201_CREATED)


class JoinRequestView(APIView):
    """A hospital asks to join the consortium; no account needed."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [ScopedThrottle]
    throttle_scope = "enrolment"

    @extend_schema(
        operation_id="hospitals_join_request",
        request=JoinRequestSerializer,
        responses={202: JoinRequestAnswerSerializer, 400: ERRORS[400], **THROTTLED},
        auth=[],
    )
    def post(self, request: Request) -> Response:
        data = _valid(JoinRequestSerializer, request)
        hospital = services.hospital_join_request(source_ip=client_ip(request), **data)
        return Response(JoinRequestAnswerSerializer(hospital).data, status=status.HTTP_202_ACCEPTED)


class HospitalDetailView(APIView):
    @extend_schema(operation_id="hospitals_retrieve", responses={200: HospitalSerializer, **ERRORS})
    def get(self, request: Request, slug: str) -> Response:
        hospital = selectors.hospital_get(actor=actor_from_request(request), slug=slug)
        return Response(HospitalSerializer(hospital).data)


class HospitalApproveView(APIView):
    @extend_schema(
        operation_id="hospitals_approve",
        request=None,
        responses={200: RegistrationSerializer, **ERRORS, **CONFLICT},
    )
    def post(self, request: Request, slug: str) -> Response:
        actor = actor_from_request(request)
        hospital = selectors.hospital_get(actor=actor, slug=slug)
        approval = services.hospital_approve(actor=actor, hospital=hospital)
        return Response(RegistrationSerializer(approval).data)


class HospitalRelayLiftView(APIView):
    @extend_schema(
        operation_id="hospitals_relay_lift",
        request=None,
        responses={200: HospitalSerializer, **ERRORS, **CONFLICT},
        description="Lift the suspension of the hospital's relay user (consortium admin).",
    )
    def post(self, request: Request, slug: str) -> Response:
        actor = actor_from_request(request)
        hospital = selectors.hospital_get(actor=actor, slug=slug)
        relay_services.relay_user_lift(actor=actor, hospital=hospital)
        return Response(HospitalSerializer(selectors.hospital_get(actor=actor, slug=slug)).data)


class HospitalRejectView(APIView):
    @extend_schema(
        operation_id="hospitals_reject",
        request=RejectSerializer,
        responses={200: HospitalSerializer, **ERRORS, **CONFLICT},
    )
    def post(self, request: Request, slug: str) -> Response:
        actor = actor_from_request(request)
        hospital = selectors.hospital_get(actor=actor, slug=slug)
        require_consortium_admin_on(actor, hospital, "reject hospitals")
        data = _valid(RejectSerializer, request)
        hospital = services.hospital_reject(actor=actor, hospital=hospital, **data)
        return Response(HospitalSerializer(hospital).data)


class EnrolmentCodeView(APIView):
    @extend_schema(
        operation_id="hospitals_enrolment_code_issue",
        request=None,
        responses={201: EnrolmentCodeSerializer, **ERRORS, **CONFLICT},
    )
    def post(self, request: Request, slug: str) -> Response:
        actor = actor_from_request(request)
        hospital = selectors.hospital_get(actor=actor, slug=slug)
        code = services.enrolment_code_issue(actor=actor, hospital=hospital)
        return Response(EnrolmentCodeSerializer(code).data, status=status.HTTP_201_CREATED)


class TokenListView(GenericAPIView):
    filter_backends: list = []
    serializer_class = TokenMetadataSerializer

    @extend_schema(
        operation_id="hospitals_tokens_list",
        responses={200: TokenMetadataSerializer(many=True), **ERRORS},
    )
    def get(self, request: Request, slug: str) -> Response:
        actor = actor_from_request(request)
        hospital = selectors.hospital_get(actor=actor, slug=slug)
        tokens = selectors.agent_tokens_of(actor=actor, hospital=hospital)
        page = self.paginate_queryset(tokens)
        return self.get_paginated_response(TokenMetadataSerializer(page, many=True).data)


class TokenRevokeView(APIView):
    @extend_schema(
        operation_id="hospitals_tokens_revoke",
        request=None,
        responses={
            200: RevocationSerializer,
            **ERRORS,
            **CONFLICT,
            503: error("the relay user could not be removed; retry"),
        },
    )
    def post(self, request: Request, slug: str) -> Response:
        actor = actor_from_request(request)
        hospital = selectors.hospital_get(actor=actor, slug=slug)
        revocation = services.hospital_tokens_revoke(actor=actor, hospital=hospital)
        return Response(RevocationSerializer(revocation).data)


# -- agent endpoints ------------------------------------------------------------------


class AgentView(APIView):
    """Agent endpoints: a bearer token first (401 with ``WWW-Authenticate: Bearer`` when it
    is missing, bad or revoked); a signed-in person gets 403 from the service."""

    authentication_classes = [AgentTokenAuthentication, SessionAuthentication]


class AgentChainView(AgentView):
    @extend_schema(
        operation_id="agent_audit_chain",
        parameters=[
            OpenApiParameter("after", OpenApiTypes.INT, description="links after this seq"),
            OpenApiParameter("limit", OpenApiTypes.INT, description="at most this many"),
        ],
        responses={200: ChainLinksSerializer, **ERRORS},
        description="The audit chain's links (sequence numbers and hashes, never content) "
        "after `after`, for the agent to check the heads it witnessed.",
    )
    def get(self, request: Request) -> Response:
        actor = actor_from_request(request)
        after = _int_param(request, "after", 0)
        limit = _int_param(request, "limit", MAX_LINKS)
        links, head = agent_witness.agent_chain_links(actor=actor, after=after, limit=limit)
        body = {"links": [vars(link) for link in links], "head": vars(head)}
        return Response(ChainLinksSerializer(body).data)


class AgentWitnessView(AgentView):
    @extend_schema(
        operation_id="agent_audit_witness",
        request=WitnessStatementSerializer,
        responses={202: None, **ERRORS},
        description="A head of the audit chain the agent witnessed is gone from it: its "
        "statement, signed with its identity key, is kept and raised on the dashboard.",
    )
    def post(self, request: Request) -> Response:
        actor = actor_from_request(request)
        require_agent(actor, "report on the audit chain")  # before judging the input
        data = _valid(WitnessStatementSerializer, request)
        verified = agent_witness.agent_witness_report(actor=actor, **data)
        return Response({"verified": verified}, status=status.HTTP_202_ACCEPTED)


def _int_param(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise InvalidInput(f"{name} must be an integer", details={name: [raw]}) from None


class EnrolView(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [ScopedThrottle]
    throttle_scope = "enrolment"

    @extend_schema(
        operation_id="agent_enrol",
        request=EnrolSerializer,
        responses={
            201: EnrolmentSerializer,
            400: error("malformed code or identity key"),
            404: error("enrolment_code_unknown"),
            410: error("enrolment_code_used, enrolment_code_revoked or enrolment_code_expired"),
            **THROTTLED,
            503: error("the relay user could not be created; retry"),
        },
        auth=[],
    )
    def post(self, request: Request) -> Response:
        data = _valid(EnrolSerializer, request)
        enrolment = services.agent_enrol(source_ip=client_ip(request), **data)
        return Response(EnrolmentSerializer(enrolment).data, status=status.HTTP_201_CREATED)


class TokenRotateView(AgentView):
    throttle_classes = [ScopedThrottle]
    throttle_scope = "token"

    @extend_schema(
        operation_id="agent_token_rotate",
        request=None,
        responses={
            201: IssuedTokenSerializer,
            401: ERRORS[401],
            403: ERRORS[403],
            409: error("the token was revoked meanwhile"),
            **THROTTLED,
        },
    )
    def post(self, request: Request) -> Response:
        token = services.agent_token_rotate(actor=actor_from_request(request), token=request.auth)
        return Response(IssuedTokenSerializer(token).data, status=status.HTTP_201_CREATED)


class IdentityMoveView(AgentView):
    throttle_classes = [ScopedThrottle]
    throttle_scope = "token"

    @extend_schema(
        operation_id="agent_identity_move",
        request=IdentityMoveSerializer,
        responses={
            200: IdentitySerializer,
            400: ERRORS[400],
            401: ERRORS[401],
            403: ERRORS[403],
            409: error("the hospital has another identity key: re-enrol with a fresh code"),
            **THROTTLED,
        },
        description="An agent enrolled with a legacy X25519 key gives its first identity "
        "key (once; audited; peers see it as a re-enrolment).",
    )
    def post(self, request: Request) -> Response:
        actor = actor_from_request(request)
        require_agent(actor, "give its identity key")  # before judging the input
        data = _valid(IdentityMoveSerializer, request)
        hospital = services.agent_identity_move(actor=actor, **data)
        return Response(IdentitySerializer(hospital).data)


class HeartbeatView(AgentView):
    @extend_schema(
        operation_id="agent_heartbeat",
        request=HeartbeatSerializer,
        responses={
            200: AgentHospitalSerializer,
            400: ERRORS[400],
            401: ERRORS[401],
            403: ERRORS[403],
        },
    )
    def post(self, request: Request) -> Response:
        actor = actor_from_request(request)
        require_agent(actor, "send heartbeats")  # before judging the input
        data = _valid(HeartbeatSerializer, request)
        hospital = services.agent_heartbeat(actor=actor, **data)
        return Response(AgentHospitalSerializer(hospital).data)


def _valid(serializer_class: type, request: Request) -> dict:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)
