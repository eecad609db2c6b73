"""StepTimeline: where each step of the service loop spent its time, over the last N steps.

``ServiceLoop`` records one row per step that ran (never while idle)::

    gap       the end of the step before to the start of this one (pacing, the loop's own
              Python, getting the GIL back); only between back-to-back steps
    lock      waiting for the state lock (commands and snapshots ahead of the step)
    step      ``service.step()`` as a whole: scheduling, the forward(s), the token hooks
              (streaming fronts), finishing requests
    forward   the model's forward(s) inside it (services with a ``forward_s`` clock)
    other     step - forward: scheduling, sampling, hooks, finishing
    offcpu    step's wall time minus the stepping thread's CPU time in it: time it was off
              the CPU inside the step (waiting for the GIL, or for a core on a loaded machine)
    publish   taking the step's events and handing them to the sink
    gc        the garbage collector's pauses during the step and its publish (any thread:
              a collection holds the GIL, so every thread waits for it)

``figures()`` gives p50, p99 and max of each in ms (the ``stats`` command carries them as
``timeline_<phase>_ms_p50`` ...), so the tail of a served engine can be read off a live one.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import deque
from typing import NamedTuple

import numpy as np

PHASES = ("gap", "lock", "step", "forward", "other", "offcpu", "publish", "gc")


class _GcClock:
    """Seconds spent in garbage collection since import (``gc.callbacks``, every thread)."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self.collections = 0
        self._started: dict[int, float] = {}

    def __call__(self, phase: str, _info: dict[str, int]) -> None:
        me = threading.get_ident()
        if phase == "start":
            self._started[me] = time.perf_counter()
        elif (t0 := self._started.pop(me, None)) is not None:
            self.total_s += time.perf_counter() - t0
            self.collections += 1


GC_CLOCK = _GcClock()
gc.callbacks.append(GC_CLOCK)


class StepRow(NamedTuple):
    """One step's phases, in seconds (``gap`` NaN after an idle wait)."""

    gap: float
    lock: float
    step: float
    forward: float
    offcpu: float
    publish: float
    gc: float


class StepTimeline:
    """The last ``window`` steps' rows (see the module doc). Written by the stepping thread,
    read by a command under the state lock: no lock of its own."""

    def __init__(self, window: int = 2048) -> None:
        self.rows: deque[StepRow] = deque(maxlen=window)
        self.steps = 0  # all steps recorded, not only the window's

    def record(self, row: StepRow) -> None:
        """Add one step."""
        self.rows.append(row)
        self.steps += 1

    def clear(self) -> None:
        """Forget the window (a benchmark's pass starts afresh)."""
        self.rows.clear()

    def figures(self) -> dict[str, float | int]:
        """``timeline_steps`` (in the window), then p50/p99/max ms of each phase."""
        out: dict[str, float | int] = {"timeline_steps": len(self.rows),
                                       "timeline_gc_collections": GC_CLOCK.collections}
        if not self.rows:
            return out
        a = np.asarray(self.rows, dtype=np.float64) * 1e3
        cols = {"gap": a[:, 0], "lock": a[:, 1], "step": a[:, 2], "forward": a[:, 3],
                "other": a[:, 2] - a[:, 3], "offcpu": a[:, 4], "publish": a[:, 5],
                "gc": a[:, 6]}
        for phase in PHASES:
            col = cols[phase]
            col = col[~np.isnan(col)]
            if col.size == 0:
                col = np.zeros(1)
            out[f"timeline_{phase}_ms_p50"] = round(float(np.percentile(col, 50)), 3)
            out[f"timeline_{phase}_ms_p99"] = round(float(np.percentile(col, 99)), 3)
            out[f"timeline_{phase}_ms_max"] = round(float(col.max()), 3)
        out["timeline_step_ms_total"] = round(float(a[:, 2].sum()), 1)
        out["timeline_forward_ms_total"] = round(float(a[:, 3].sum()), 1)
        return out
