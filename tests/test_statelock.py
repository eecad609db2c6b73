"""The loop's state lock lets a waiting command in at the next step boundary."""

from __future__ import annotations

import threading

from radixcache.serving.statelock import StateLock
from tests.helpers.stream import wait_for


def test_a_waiter_goes_in_before_the_stepper_takes_its_next_turn():
    """The stepper holds the lock for a step while a command starts waiting; when the step
    ends, the command runs before the next step (a plain Lock lets the stepper take it again
    first: that starved `stats` for seconds under a flood)."""
    lock = StateLock()
    order: list[str] = []
    in_step, end_step = threading.Event(), threading.Event()

    def stepper() -> None:
        with lock.turn():
            in_step.set()
            end_step.wait(10)
        with lock.turn():  # at once: in a loop the next step follows without a pause
            order.append("next step")

    def command() -> None:
        with lock:
            order.append("command")

    steps = threading.Thread(target=stepper)
    steps.start()
    assert in_step.wait(10)
    waiter = threading.Thread(target=command)
    waiter.start()
    assert wait_for(lambda: lock._waiting == 1)  # the command is blocked on the held lock
    end_step.set()
    steps.join(10)
    waiter.join(10)
    assert order == ["command", "next step"]
    assert not lock.locked()


def test_the_lock_is_released_when_the_holder_raises():
    lock = StateLock()
    try:
        with lock:
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert not lock.locked()
    with lock.turn():
        assert lock.locked()
    assert not lock.locked()
