"""``manage.py runserver``: Django's, static files included, answering without Nagle's
delay (coordinator/dev_server.py)."""

from __future__ import annotations

from django.contrib.staticfiles.management.commands.runserver import (
    Command as StaticFilesRunserver,
)

from coordinator.dev_server import NoDelayWSGIServer


class Command(StaticFilesRunserver):
    server_cls = NoDelayWSGIServer
