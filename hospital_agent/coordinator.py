"""The coordinator's API as the agent uses it, over HTTPS, with retries.

Only outbound requests: the agent opens no port. Connection failures and server errors
(5xx) are retried with exponential backoff and logged; a refused token (401) is
:class:`TokenRefused`, which stops the agent; any other refusal is
:class:`CoordinatorRefused`, carrying the coordinator's error code and message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import requests

from medsplit.errors import MedSplitError

logger = logging.getLogger(__name__)


class CoordinatorError(MedSplitError):
    """The coordinator could not be used."""


class CoordinatorUnreachable(CoordinatorError):
    """No answer after every retry."""


class CoordinatorRefused(CoordinatorError):
    """The coordinator answered with an error (4xx)."""

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"the coordinator refused ({status} {code}): {message}")
        self.status, self.code, self.details = status, code, details


class TokenRefused(CoordinatorRefused):
    """The agent token was revoked or is unknown: the agent must stop."""


@dataclass
class Backoff:
    """Exponential backoff: ``first`` seconds, doubling up to ``longest``, for at most
    ``give_up_after`` seconds in all (``None``: forever, until stopped)."""

    first: float = 1.0
    longest: float = 60.0
    give_up_after: float | None = 300.0


class Coordinator:
    """The coordinator's agent API.

    Args:
        url: the coordinator's base URL (``https://...``).
        token: the agent token, once enrolled.
        ca_bundle: a CA file to check the coordinator's certificate with (default: the
            system's CAs).
        stopping: set when the agent shuts down; retries give up at once.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        ca_bundle: str | None = None,
        backoff: Backoff | None = None,
        stopping: threading.Event | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.backoff = backoff or Backoff()
        self.stopping = stopping or threading.Event()
        self.timeout = timeout
        self._session = requests.Session()
        #: Given with every request: requests lets REQUESTS_CA_BUNDLE (or CURL_CA_BUNDLE)
        #: in the environment override a session's own ``verify``, and a hospital's
        #: machine often sets one, which would silently put the system's CAs in place of
        #: the consortium's ``ca_bundle``.
        self._verify: str | bool = ca_bundle if ca_bundle else True
        self._session.verify = self._verify
        self._session.headers["User-Agent"] = "medsplit-agent"

    # -- the API --------------------------------------------------------------------------

    def enrol(self, *, code: str, identity_key: str) -> dict[str, Any]:
        """Exchange a one-time enrolment code and the agent's identity public key for its
        token and relay credentials (each shown once)."""
        return self._call(
            "POST", "/api/agent/enrol/", json={"code": code, "identity_key": identity_key}
        )

    def move_to_identity_key(self, *, identity_key: str) -> dict[str, Any]:
        """Give a hospital enrolled with a legacy X25519 key its first identity key (once;
        any later change of identity needs a fresh enrolment code)."""
        return self._call("POST", "/api/agent/identity/", json={"identity_key": identity_key})

    def publish_recipient_key(self, *, job: int, key: str, signature: str) -> dict[str, Any]:
        """Publish this hospital's per-job recipient key for ``job``, signed with its
        identity key."""
        body = {"key": key, "signature": signature}
        return self._call("POST", f"/api/agent/assignments/{job}/recipient-key/", json=body)

    def heartbeat(
        self,
        *,
        status: str,
        version: str,
        summary: dict[str, Any] | None,
        data_problem: str = "",
        started_at: str | None = None,
    ) -> dict[str, Any]:
        """Alive, with the data's summary, or (``summary`` None) what is wrong with it;
        ``started_at``: when this agent's process started (a new one shows a restart)."""
        body: dict[str, Any] = {"agent_status": status, "agent_version": version}
        if started_at:
            body["started_at"] = started_at
        if summary is not None:
            body["dataset_summary"] = summary
        if data_problem:
            body["data_problem"] = data_problem[:2000]
        return self._call("POST", "/api/agent/heartbeat/", json=body)

    def assignments(self, *, wait: float = 0.0, etag: str = "") -> tuple[list[dict], str]:
        """The agent's jobs; with ``wait``, held until they differ from ``etag``."""
        response = self._request(
            "GET",
            "/api/agent/assignments/",
            params={"wait": f"{wait:g}", "etag": etag},
            timeout=self.timeout + wait,
        )
        return response.json(), response.headers.get("ETag", "")

    def assignment(self, job: int) -> dict[str, Any]:
        """The agent's assignment of ``job`` (a completed job's too)."""
        return self._call("GET", f"/api/agent/assignments/{job}/")

    def request_inference(self, *, job: int, samples: int) -> dict[str, Any]:
        """Ask for predictions on ``samples`` images through ``job``'s final model: the
        request's id, round, position, serving batch and stream topic."""
        body = {"samples": samples}
        return self._call("POST", f"/api/agent/assignments/{job}/inference/", json=body)

    def request_vertical_prediction(self, *, job: int, records: int) -> dict[str, Any]:
        """Ask, as the label party of vertical ``job``, for predictions on ``records`` of
        its records (every party's agent answers): this party's part's id, round and
        position."""
        body = {"records": records}
        return self._call("POST", f"/api/agent/assignments/{job}/vertical-predictions/", json=body)

    def export(self, export_id: int) -> dict[str, Any]:
        """An export of a job this hospital took part in: its state, key and parts."""
        return self._call("GET", f"/api/agent/exports/{export_id}/")

    def approve_export(self, export_id: int) -> dict[str, Any]:
        return self._call("POST", f"/api/agent/exports/{export_id}/approve/")

    def refuse_export(self, export_id: int, *, reason: str) -> dict[str, Any]:
        return self._call(
            "POST", f"/api/agent/exports/{export_id}/refuse/", json={"reason": reason}
        )

    def publish_export_key(self, export_id: int, *, key: str, signature: str) -> dict[str, Any]:
        """The receiving hospital's fresh export key, signed with its identity key."""
        body = {"key": key, "signature": signature}
        return self._call("POST", f"/api/agent/exports/{export_id}/key/", json=body)

    def upload_export_part(self, export_id: int, blob: bytes) -> dict[str, Any]:
        """This hospital's segments sealed to the export key (the coordinator keeps
        ciphertext only)."""
        return self._call(
            "POST",
            f"/api/agent/exports/{export_id}/parts/",
            data=blob,
            extra_headers={"Content-Type": "application/octet-stream"},
        )

    def download_export_part(self, export_id: int, name: str) -> bytes:
        """One sealed part of an export this hospital receives."""
        return self._request("GET", f"/api/agent/exports/{export_id}/parts/{name}/").content

    def export_fetched(self, export_id: int, *, parts: int, size_bytes: int) -> dict[str, Any]:
        body = {"parts": parts, "size_bytes": size_bytes}
        return self._call("POST", f"/api/agent/exports/{export_id}/fetched/", json=body)

    def audit_head(self) -> dict[str, Any]:
        """The audit chain's head (its sequence number and hash)."""
        return self._call("GET", "/api/agent/audit/chain/", params={"after": 0, "limit": 1})["head"]

    def record_handoffs(
        self, *, job: int, turn: int, sealed: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Record several blobs sealed after ``turn`` in one request, all or none: each a
        ``recipient``, ``ciphertext_sha256`` and ``size_bytes``."""
        body = {"turn": turn, "handoffs": sealed}
        return self._call("POST", f"/api/agent/assignments/{job}/handoffs/batch/", json=body)

    def audit_chain(self, *, after: int) -> dict[str, Any]:
        """The audit chain's links after sequence number ``after``, and its head."""
        return self._call("GET", "/api/agent/audit/chain/", params={"after": after})

    def report_witness(self, *, statement: str, signature: str) -> dict[str, Any]:
        """Tell the coordinator a witnessed head is gone from the chain (signed)."""
        body = {"statement": statement, "signature": signature}
        return self._call("POST", "/api/agent/audit/witness/", json=body)

    def report_problem(self, *, job: int, turn: int, reason: str) -> dict[str, Any]:
        body = {"turn": turn, "reason": reason}
        return self._call("POST", f"/api/agent/assignments/{job}/problems/", json=body)

    def report_evaluation_problem(
        self, *, job: int, evaluation: int, reason: str, no_test_set: bool = False
    ) -> dict[str, Any]:
        """This hospital cannot take part in its evaluation of ``job`` (no test set, or one
        it cannot read): its part ends with ``reason`` (files, never data)."""
        body = {"evaluation": evaluation, "reason": reason, "no_test_set": no_test_set}
        return self._call("POST", f"/api/agent/assignments/{job}/evaluation-problems/", json=body)

    def record_submission(
        self,
        *,
        job: int,
        round_index: int,
        attempt: int,
        sha256: str,
        size_bytes: int,
        counts: dict[str, list[int]],
    ) -> dict[str, Any]:
        """Tell the coordinator this hospital's masked submission is on the relay."""
        body = {
            "round": round_index,
            "attempt": attempt,
            "sha256": sha256,
            "size_bytes": size_bytes,
            "counts": counts,
        }
        return self._call("POST", f"/api/agent/assignments/{job}/submissions/", json=body)

    def report_alignment(self, *, job: int, digest: str, size: int) -> dict[str, Any]:
        """Tell the coordinator the digest and size of the intersection this hospital
        holds (never an identifier); returns the job's alignment state."""
        body = {"digest": digest, "size": size}
        return self._call("POST", f"/api/agent/assignments/{job}/alignment/", json=body)

    def alignment(self, *, job: int) -> dict[str, Any]:
        """The job's alignment state: ``status`` (pending, agreed, mismatch, too_small),
        ``size`` and ``reason``."""
        return self._call("GET", f"/api/agent/assignments/{job}/alignment/")

    def report_leakage(
        self, *, job: int, round_index: int, parties: dict[str, dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The label party's label-leakage audit of a round: each passive party's records
        scored and the attacks' AUCs (never a score, gradient or label)."""
        body = {"round": round_index, "parties": parties}
        return self._call("POST", f"/api/agent/assignments/{job}/leakage/", json=body)

    def report_privacy(
        self, *, job: int, round_index: int, figures: dict[str, Any]
    ) -> dict[str, Any]:
        """This hospital's privacy figures of a round: numbers only (never a picture, an
        activation, a gradient or a label; ``hospital_agent/privacy_report.py``)."""
        body = {"round": round_index, **figures}
        return self._call("POST", f"/api/agent/assignments/{job}/privacy/", json=body)

    def report_loss(self, *, job: int, turn: int, step: int, loss: float) -> dict[str, Any]:
        """The hospital's own training loss at ``step`` of its running turn (modes whose
        loss is computed at the hospital). Tried for a couple of seconds only: a late
        report is worth nothing (``hospital_agent/loss_report.py``)."""
        body = {"turn": turn, "step": step, "loss": loss}
        path = f"/api/agent/assignments/{job}/progress/"
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        response = retrying(
            lambda: self._once(
                "POST", path, json=body, headers=headers, timeout=5.0, verify=self._verify
            ),
            what=f"POST {path}",
            backoff=Backoff(first=0.5, longest=1.0, give_up_after=2.0),
            stopping=self.stopping,
        )
        return response.json()

    # -- plumbing -------------------------------------------------------------------------

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    def _request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", self.timeout)
        kwargs.setdefault("verify", self._verify)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        headers.update(kwargs.pop("extra_headers", None) or {})
        return retrying(
            lambda: self._once(method, path, headers=headers, **kwargs),
            what=f"{method} {path}",
            backoff=self.backoff,
            stopping=self.stopping,
        )

    def _once(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        try:
            response = self._session.request(method, self.url + path, **kwargs)
        except requests.RequestException as e:
            raise _Retry(f"the coordinator at {self.url} did not answer: {e}") from e
        if response.status_code >= 500:
            raise _Retry(f"the coordinator at {self.url} failed ({response.status_code})")
        if response.status_code == 429:  # throttled: a while later it will answer
            raise _Retry(
                f"the coordinator at {self.url} asks this agent to slow down (429)",
                after=_retry_after(response),
            )
        if response.status_code >= 400:
            raise _refusal(response)
        return response


class _Retry(Exception):
    def __init__(self, message: str, *, after: float = 0.0) -> None:
        super().__init__(message)
        self.after = after  # the least wait the coordinator asked for, in seconds


def _retry_after(response: requests.Response) -> float:
    """``Retry-After`` in seconds (DRF's throttles send it); 0 when absent or a date."""
    try:
        return max(0.0, float(response.headers.get("Retry-After", "0")))
    except ValueError:
        return 0.0


def retrying(
    call: Callable[[], Any], *, what: str, backoff: Backoff, stopping: threading.Event
) -> Any:
    """``call()`` until it stops raising ``_Retry``, waiting longer each time."""
    delay, started = backoff.first, time.monotonic()
    while True:
        try:
            return call()
        except _Retry as e:
            waited = time.monotonic() - started
            pause = max(delay, e.after)
            if stopping.is_set() or (
                backoff.give_up_after is not None and waited + pause > backoff.give_up_after
            ):
                raise CoordinatorUnreachable(f"{what}: {e} (gave up after {waited:.0f} s)") from e
            logger.warning("%s: %s; trying again in %.0f s", what, e, pause)
            if stopping.wait(pause):
                raise CoordinatorUnreachable(f"{what}: {e} (stopped)") from e
            delay = min(delay * 2, backoff.longest)


def _refusal(response: requests.Response) -> CoordinatorRefused:
    try:
        body = response.json()
        code, message, details = body.get("code", "?"), body.get("message", ""), body.get("details")
    except ValueError:
        code, message, details = "?", response.text[:200], None
    kind = TokenRefused if response.status_code == 401 else CoordinatorRefused
    return kind(response.status_code, code, message, details)
