"""The vertical step in one task: one turn per party, each step joining all their frames.

Each party's turn is a :class:`~medsplit.turns.server.TurnServer` in its own thread with
its own streams, handshake and record; its server role is a :class:`JointPartyRole` that
hands the party's frame to the one :class:`JointStep` and waits for the party's answer.
The joint step runs the mode's joint server role (:class:`~medsplit.modes.vertical.VerticalServer`)
once every party's frame of the step is in, so the top segment sees the same steps in
the same order whatever the timing. :class:`JointStep` is also the turns' step gate: a
party that would resume mid-round fails the round (the top cannot go back for one party).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from medsplit.modes.base import JointServerRole
from medsplit.protocol.checks import FrameRejected
from medsplit.protocol.roles import AppliedSteps, ServerRole
from medsplit.turns.server import TurnFailed
from medsplit.wire import Frame, FrameKind, FrameSpec

__all__ = ["JointPartyRole", "JointStep"]


class JointStep:
    """Collects one step's frame from every party, runs the joint server, hands out the
    answers (see the module docstring).

    Args:
        server: the mode's joint server role.
        steps: training steps of the round (every party takes each one).
        wait: longest wait between two looks at whether the round failed, in seconds.
    """

    def __init__(self, server: JointServerRole, *, steps: int, wait: float = 1.0) -> None:
        self.server = server
        self.steps = steps
        self.wait = wait
        self._cond = threading.Condition()
        self._frames: dict[str, Frame] = {}
        self._answers: dict[str, Frame] = {}
        self._half = False  # a step's forward ran, its backward has not (labels at home)
        self._failed: str | None = None
        self.done = 0
        #: The steps applied, in order (every party's at once).
        self.served: list[int] = []

    @property
    def trained(self) -> bool:
        return self.done >= self.steps

    def fail(self, reason: str) -> None:
        """The round cannot go on: every party waiting here fails with ``reason``."""
        with self._cond:
            if self._failed is None:
                self._failed = reason
            self._cond.notify_all()

    def _check(self) -> None:
        if self._failed is not None:
            raise TurnFailed(f"the round's joint step stopped: {self._failed}")

    def exchange(self, party: str, frame: Frame) -> Frame:
        """``party``'s frame in, ``party``'s answer out, once the step computed it.

        Raises:
            FrameRejected: a frame of this step failed a check (raised in the thread of
                the party whose frame completed the step; the others fail with its reason).
            TurnFailed: the round failed.
        """
        with self._cond:
            self._check()
            self._answers.pop(party, None)
            if frame.meta.kind == FrameKind.HEAD_GRADIENTS:
                self._run(party, lambda: self.server.backward(frame))
            else:
                if party in self._frames:
                    raise TurnFailed(f"{party} sent a second frame for one step")
                self._frames[party] = frame
                if set(self._frames) == set(self.server.parties):
                    frames, self._frames = self._frames, {}
                    self._run(party, lambda: self.server.forward(frames))
            while party not in self._answers:
                self._check()
                self._cond.wait(self.wait)
            return self._answers.pop(party)

    def _run(self, party: str, compute) -> None:
        try:
            answers = compute()
        except FrameRejected as e:
            self._failed = f"{e}"
            self._cond.notify_all()
            raise
        except Exception as e:
            self._failed = f"{type(e).__name__}: {e}"
            self._cond.notify_all()
            raise
        self._half = not all(a.meta.kind == FrameKind.GRADIENTS for a in answers.values())
        if not self._half:
            self.done += 1
            self.served.append(next(iter(answers.values())).meta.step)
        self._answers.update(answers)
        self._cond.notify_all()

    def wait_trained(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every step; whether they ran.

        Raises:
            TurnFailed: the round failed.
        """
        with self._cond:
            self._cond.wait_for(lambda: self.trained or self._failed is not None, timeout)
            self._check()
            return self.trained

    # -- the step gate of each party's TurnServer ----------------------------------------

    @contextmanager
    def restoring(self, position: int, start: int) -> Iterator[None]:
        with self._cond:
            self._check()
            # A party's first frame may already wait here: nothing ran on it yet, so a
            # late party loading the round's start changes nothing. Once a step ran, it
            # would take the top back for everybody.
            if self.done or self._half or start != 0:
                raise TurnFailed(
                    f"the party at position {position} would resume at step {start} after "
                    f"{self.done} joint step(s) of the round ran: the top segment cannot go "
                    "back for one party, so the round starts again"
                )
            yield

    def acquire(self, position: int, step: int) -> None:
        """Every party's step runs at once: nothing to wait for before sending."""

    def release(self, position: int, step: int) -> None:
        """See :meth:`acquire`."""

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        raise TurnFailed(
            "a vertical round validates nothing on the server: each validation batch would "
            "need every party's features of the same records"
        )
        yield  # pragma: no cover


class JointPartyRole(ServerRole):
    """One party's server role in a joint step: its frames go to the :class:`JointStep`;
    a re-sent frame of the latest step gets the same answer, computed once.

    Args:
        joint: the round's joint step.
        party: the party this role serves.
        job: the job; frames of other jobs are refused.
        mode: the job's mode name, written into its frames.
    """

    def __init__(self, joint: JointStep, *, party: str, job: str, mode: str) -> None:
        self.joint = joint
        self.party = party
        self.mode = mode
        self.applied = AppliedSteps(job)

    def handle(self, frame: Frame) -> Frame:
        again = self.applied.answer_again(frame, who="server")
        if again is not None:
            return again
        reply = self.joint.exchange(self.party, frame)
        self.applied.record(frame, reply)
        return reply

    def expect(self) -> FrameSpec:
        return self.joint.server.expect(self.party)
