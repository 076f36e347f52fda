"""Django's admin without a password form of its own.

The admin is off unless ``MEDSPLIT_DJANGO_ADMIN=1`` (``coordinator.urls``). When it is
on, ``/admin/login/`` checks no password: it sends people to the dashboard's sign-in,
which is throttled per address, slowed per account, CSRF-checked and audited
(``accounts.services.person_sign_in``); the admin then uses that session. So there is
one way to sign in, and no second door beside it.
"""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import redirect
from django.urls import reverse

#: Where people sign in (the dashboard's sign-in page).
SIGN_IN_URL = "/#/sign-in"


class AdminSite(admin.AdminSite):
    site_header = "MedSplit coordinator (read-only)"

    def login(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        """Staff already signed in go on to the admin; others sign in on the dashboard."""
        user = request.user
        if user.is_authenticated and user.is_active and user.is_staff:
            return redirect(reverse("admin:index", current_app=self.name))
        if user.is_authenticated:
            return HttpResponseForbidden(
                "Your account may not use the Django admin (it is not staff).",
                content_type="text/plain",
            )
        return redirect(SIGN_IN_URL)
