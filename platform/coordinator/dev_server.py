"""The coordinator's development server (``manage.py runserver``: the demo, the benchmarks,
the tests' live server) with Nagle's algorithm off on every connection.

Django's server writes a response's headers and its body in separate ``send`` calls on a
kept-alive connection. With Nagle's algorithm on, the body's last segment waits for the
client to acknowledge the headers, and the client delays that acknowledgement (40 ms on
Linux): every agent request to a ``runserver`` coordinator took about 44 ms however small
(docs/benchmarks.md, "Scaling"). gunicorn, which serves a deployment, sets
``TCP_NODELAY`` on its sockets itself; this does the same for Django's server.
"""

from __future__ import annotations

import socket

from django.core.servers.basehttp import ThreadedWSGIServer, WSGIServer


class NoDelayMixin:
    """A ``socketserver`` server whose accepted TCP connections send at once."""

    def get_request(self) -> tuple[socket.socket, object]:
        connection, address = super().get_request()  # type: ignore[misc]
        if connection.family in (socket.AF_INET, socket.AF_INET6):
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection, address


class NoDelayWSGIServer(NoDelayMixin, WSGIServer):
    """``runserver``'s server class (it adds its own threading on top)."""


class NoDelayThreadedWSGIServer(NoDelayMixin, ThreadedWSGIServer):
    """The tests' live server (``LiveServerThread.server_class``)."""
