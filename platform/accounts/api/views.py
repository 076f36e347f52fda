"""Accounts API: signing in and out, who am I, people. Thin views over the services."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import selectors, services
from accounts.api.serializers import (
    MeSerializer,
    PersonCreateSerializer,
    PersonSerializer,
    PersonUpdateSerializer,
    SignInSerializer,
)
from kernel.actors import Role, actor_from_request
from kernel.api.csrf import require_csrf
from kernel.api.errors_schema import error
from kernel.api.throttling import ScopedThrottle
from kernel.permissions import require_consortium_admin, require_person

ERRORS = {
    400: error("invalid input: {code, message, details}"),
    401: error("not signed in"),
    403: error("your role may not do this"),
}
NOT_FOUND = {404: error("no such person, or not one you may see")}


class SignInView(APIView):
    """Username and password for a session cookie.

    Checked like every session write: Django's CSRF cookie and ``X-CSRFToken`` (the
    dashboard gets the cookie with its page), so no other site can sign a browser in
    (login CSRF). Throttled per client address, and slowed per username and address
    after failures (``accounts.sign_in_delay``); agents never use it.
    """

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [ScopedThrottle]
    throttle_scope = "sign_in"

    def throttled(self, request: Request, wait: float | None) -> None:
        services.sign_in_throttled(request=request, wait=wait)
        super().throttled(request, wait)

    @extend_schema(
        operation_id="auth_sign_in",
        request=SignInSerializer,
        responses={
            200: MeSerializer,
            400: error("invalid input, or invalid_credentials"),
            403: error("csrf_failed: no CSRF cookie and token of this coordinator's pages"),
            429: error(
                "too many attempts from this address, or for this username from it; see Retry-After"
            ),
        },
        auth=[],
    )
    def post(self, request: Request) -> Response:
        require_csrf(request, what="signing in")
        serializer = SignInSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        user = services.person_sign_in(request=request, **serializer.validated_data)
        return Response(_me(user))


class SignOutView(APIView):
    @extend_schema(operation_id="auth_sign_out", request=None, responses={204: None, **ERRORS})
    def post(self, request: Request) -> Response:
        services.person_sign_out(request=request, actor=actor_from_request(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class MeView(APIView):
    @extend_schema(operation_id="auth_me", responses={200: MeSerializer, **ERRORS})
    def get(self, request: Request) -> Response:
        require_person(actor_from_request(request))
        return Response(_me(request.user))


def _me(user) -> dict:
    role, hospital = selectors.role_of(user)
    return MeSerializer(
        {
            "username": user.get_username(),
            "role": role.value if role is not None else None,
            "hospital": hospital.slug if hospital is not None else None,
        }
    ).data


class PeopleView(GenericAPIView):
    """``GET``: the people you may see. ``POST``: add a person (consortium admin)."""

    filter_backends: list = []
    serializer_class = PersonSerializer

    @extend_schema(
        operation_id="people_list", responses={200: PersonSerializer(many=True), **ERRORS}
    )
    def get(self, request: Request) -> Response:
        people = selectors.people_visible_to(actor=actor_from_request(request))
        page = self.paginate_queryset(people)
        return self.get_paginated_response(PersonSerializer(page, many=True).data)

    @extend_schema(
        operation_id="people_create",
        request=PersonCreateSerializer,
        responses={201: PersonSerializer, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        actor = actor_from_request(request)
        require_consortium_admin(actor, "add people")  # before judging the input
        serializer = PersonCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        person = services.person_create(
            actor=actor,
            username=data["username"],
            password=data["password"],
            role=Role(data["role"]),
            hospital_slug=data["hospital"],
            email=data["email"],
        )
        return Response(PersonSerializer(person).data, status=status.HTTP_201_CREATED)


class PersonView(APIView):
    @extend_schema(
        operation_id="people_retrieve", responses={200: PersonSerializer, **ERRORS, **NOT_FOUND}
    )
    def get(self, request: Request, person_id: int) -> Response:
        person = selectors.person_get(actor=actor_from_request(request), person_id=person_id)
        return Response(PersonSerializer(person).data)

    @extend_schema(
        operation_id="people_update",
        request=PersonUpdateSerializer,
        responses={
            200: PersonSerializer,
            **ERRORS,
            **NOT_FOUND,
            409: error("a consortium admin demoting or deactivating themself"),
        },
    )
    def patch(self, request: Request, person_id: int) -> Response:
        actor = actor_from_request(request)
        person = selectors.person_get(actor=actor, person_id=person_id)
        require_consortium_admin(actor, "change people")  # before judging the input
        serializer = PersonUpdateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        changes = dict(serializer.validated_data)
        if "role" in changes:
            changes["role"] = Role(changes["role"]) if changes["role"] is not None else None
        if "hospital" in changes:
            changes["hospital_slug"] = changes.pop("hospital")
        person = services.person_update(actor=actor, person=person, **changes)
        return Response(PersonSerializer(person).data)
