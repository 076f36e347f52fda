"""A hospital on a network link of its own: a Linux network namespace joined to this host
by a veth pair, which a test can cut and restore.

A process started under :attr:`Link.prefix` (``ip netns exec NAME ...``) has no network
but the link: it reaches this host only at :attr:`Link.host_ip`, so everything it says to
the coordinator and the relay crosses the link, and :meth:`Link.cut` takes the cable out
(the host's end goes down, the namespace's end loses its carrier: packets go nowhere and
connections time out, as across a real cut). Needs root and ``ip`` (iproute2);
:func:`unavailable` says why not, for a test to skip with.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def unavailable() -> str | None:
    """Why a network namespace cannot be made here, or ``None`` when it can."""
    if shutil.which("ip") is None:
        return "no `ip` command (Debian's iproute2 package)"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    probe = f"ms-probe-{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` is not permitted here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Link:
    """A namespace and the veth pair that joins it to this host (a /30 of 10.213.x.y)."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    subnet: int = field(default_factory=lambda: random.randrange(0, 1 << 14))

    @property
    def name(self) -> str:
        return f"medsplit-{self.tag}"

    @property
    def host_if(self) -> str:
        return f"ms{self.tag}h"  # interface names: at most 15 characters

    @property
    def ns_if(self) -> str:
        return f"ms{self.tag}n"

    def _address(self, host: int) -> str:
        base = self.subnet * 4
        return f"10.213.{base >> 8}.{(base & 0xFF) + host}"

    @property
    def host_ip(self) -> str:
        return self._address(1)

    @property
    def ns_ip(self) -> str:
        return self._address(2)

    @property
    def prefix(self) -> list[str]:
        """What a command line starts with to run inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def create(self) -> None:
        _ip("netns", "add", self.name)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        _ip("link", "set", self.ns_if, "netns", self.name)
        _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        inside = ["-n", self.name]
        _ip(*inside, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
        _ip(*inside, "link", "set", self.ns_if, "up")
        _ip(*inside, "link", "set", "lo", "up")

    def cut(self) -> None:
        """Take the cable out: the host's end down, the namespace's end without carrier."""
        _ip("link", "set", self.host_if, "down")

    def restore(self) -> None:
        _ip("link", "set", self.host_if, "up")

    def delete(self) -> None:
        """Kill what still runs inside, remove the pair and the namespace; never raises."""
        pids = _ip("netns", "pids", self.name, check=False).stdout.split()
        for pid in pids:
            with suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("link", "del", self.host_if, check=False)  # both ends go
        _ip("netns", "del", self.name, check=False)


@contextmanager
def link() -> Iterator[Link]:
    """A namespace with its link up; removed afterwards, whatever happened."""
    made = Link()
    try:
        made.create()
        yield made
    finally:
        made.delete()
