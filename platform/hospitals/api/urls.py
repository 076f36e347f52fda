"""API routes of the hospitals app (under /api/)."""

from django.urls import path

from hospitals.api import views

urlpatterns = [
    path("hospitals/", views.HospitalListView.as_view(), name="hospitals"),
    # Before <slug>/: "join-requests" is a reserved slug.
    path(
        "hospitals/join-requests/", views.JoinRequestView.as_view(), name="hospital-join-requests"
    ),
    path("hospitals/<slug:slug>/", views.HospitalDetailView.as_view(), name="hospital"),
    path(
        "hospitals/<slug:slug>/approve/",
        views.HospitalApproveView.as_view(),
        name="hospital-approve",
    ),
    path(
        "hospitals/<slug:slug>/reject/", views.HospitalRejectView.as_view(), name="hospital-reject"
    ),
    path(
        "hospitals/<slug:slug>/relay/lift/",
        views.HospitalRelayLiftView.as_view(),
        name="hospital-relay-lift",
    ),
    path(
        "hospitals/<slug:slug>/enrolment-codes/",
        views.EnrolmentCodeView.as_view(),
        name="hospital-enrolment-codes",
    ),
    path("hospitals/<slug:slug>/tokens/", views.TokenListView.as_view(), name="hospital-tokens"),
    path(
        "hospitals/<slug:slug>/tokens/revoke/",
        views.TokenRevokeView.as_view(),
        name="hospital-tokens-revoke",
    ),
    path("agent/enrol/", views.EnrolView.as_view(), name="agent-enrol"),
    path("agent/token/rotate/", views.TokenRotateView.as_view(), name="agent-token-rotate"),
    path("agent/identity/", views.IdentityMoveView.as_view(), name="agent-identity"),
    path("agent/heartbeat/", views.HeartbeatView.as_view(), name="agent-heartbeat"),
    path("agent/audit/chain/", views.AgentChainView.as_view(), name="agent-audit-chain"),
    path("agent/audit/witness/", views.AgentWitnessView.as_view(), name="agent-audit-witness"),
]
