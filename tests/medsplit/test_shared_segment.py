"""The gate of turns sharing one server segment (SFLV2): steps run one at a time in the
given order whatever order the threads ask in, nobody trains before every turn loaded the
start, a turn cannot load it again once a step ran, validation waits for the last step,
and one failure wakes every waiting turn."""

from __future__ import annotations

import threading
import time

import pytest

from medsplit.turns import TurnFailed
from medsplit.turns.shared import SharedSegmentGate, SharedStart
from medsplit.turns.stores import StoreError

ORDER = [1, 0, 0, 1, 1, 0]


def restored(gate: SharedSegmentGate, *positions: int) -> None:
    for p in positions:
        with gate.restoring(p, 0):
            pass


def test_steps_run_in_the_given_order_whatever_order_the_threads_ask_in() -> None:
    gate = SharedSegmentGate(ORDER, wait=0.01)
    restored(gate, 0, 1)

    def turn(position: int, delay: float) -> None:
        for step in range(ORDER.count(position)):
            time.sleep(delay)
            gate.acquire(position, step)
            gate.release(position, step)

    threads = [
        threading.Thread(target=turn, args=(0, 0.0)),
        threading.Thread(target=turn, args=(1, 0.02)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert [p for p, _ in gate.served] == ORDER
    assert gate.trained


def test_no_step_runs_before_every_turn_loaded_the_start() -> None:
    gate = SharedSegmentGate([0, 1], wait=0.01)
    restored(gate, 0)
    took = threading.Event()

    def first() -> None:
        gate.acquire(0, 0)
        took.set()

    thread = threading.Thread(target=first)
    thread.start()
    assert not took.wait(0.2), "a step ran before position 1 loaded the start"
    restored(gate, 1)
    assert took.wait(5)
    thread.join()


def test_a_turn_cannot_load_the_start_again_once_a_step_ran() -> None:
    gate = SharedSegmentGate([0, 1], wait=0.01)
    restored(gate, 0, 1)
    gate.acquire(0, 0)
    gate.release(0, 0)
    with pytest.raises(TurnFailed, match="cannot go back for one hospital"), gate.restoring(1, 0):
        pass


def test_a_step_out_of_its_turns_order_is_refused() -> None:
    gate = SharedSegmentGate([0, 0], wait=0.01)
    restored(gate, 0)
    with pytest.raises(TurnFailed, match="sent step 1 where its step 0 is next"):
        gate.acquire(0, 1)


def test_one_failure_wakes_every_waiting_turn_and_validation_waits_for_training() -> None:
    gate = SharedSegmentGate([0, 1], wait=0.01)
    restored(gate, 0, 1)
    errors: list[BaseException] = []

    def wait_for_eval() -> None:
        try:
            with gate.evaluating():
                pass
        except TurnFailed as e:
            errors.append(e)

    thread = threading.Thread(target=wait_for_eval)
    thread.start()
    time.sleep(0.1)
    assert thread.is_alive(), "validation ran before the last training step"
    gate.fail("the turn of h2 ended: HospitalSilent")
    thread.join(5)
    assert errors and "h2" in str(errors[0])
    with pytest.raises(TurnFailed, match="stopped"):
        gate.acquire(0, 0)


def test_a_shared_turns_store_holds_the_rounds_start_only() -> None:
    store = SharedStart(b"start")
    store.save(3, b"after step 3")
    assert store.steps() == [-1] and store.load(-1) == b"start"
    with pytest.raises(StoreError, match="keeps the round's start only"):
        store.load(3)
