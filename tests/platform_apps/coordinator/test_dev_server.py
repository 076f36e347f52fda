"""The development server (``manage.py runserver``, the tests' live server) answers
without Nagle's delay: each agent request to it waited 40 ms for a delayed
acknowledgement (coordinator/dev_server.py)."""

from __future__ import annotations

import socket

import pytest
from django.contrib.staticfiles.management.commands.runserver import (
    Command as StaticFilesRunserver,
)
from django.core.management import get_commands, load_command_class
from django.core.servers.basehttp import WSGIRequestHandler

from coordinator.dev_server import NoDelayMixin, NoDelayThreadedWSGIServer, NoDelayWSGIServer


@pytest.mark.parametrize("server_class", [NoDelayWSGIServer, NoDelayThreadedWSGIServer])
def test_an_accepted_connection_sends_at_once(server_class: type) -> None:
    server = server_class(("127.0.0.1", 0), WSGIRequestHandler)
    try:
        with socket.create_connection(server.server_address[:2], timeout=5):
            connection, _ = server.get_request()
            try:
                assert connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
            finally:
                connection.close()
    finally:
        server.server_close()


def test_runserver_is_the_coordinators_and_still_serves_static_files() -> None:
    command = load_command_class(get_commands()["runserver"], "runserver")
    assert command.server_cls is NoDelayWSGIServer
    assert isinstance(command, StaticFilesRunserver)


def test_the_tests_live_server_sends_at_once(live_server) -> None:
    assert isinstance(live_server.thread.httpd, NoDelayMixin)
