"""API routes of the accounts app (under /api/)."""

from django.urls import path

from accounts.api import views

urlpatterns = [
    path("auth/sign-in/", views.SignInView.as_view(), name="auth-sign-in"),
    path("auth/sign-out/", views.SignOutView.as_view(), name="auth-sign-out"),
    path("auth/me/", views.MeView.as_view(), name="auth-me"),
    path("people/", views.PeopleView.as_view(), name="people"),
    path("people/<int:person_id>/", views.PersonView.as_view(), name="person"),
]
