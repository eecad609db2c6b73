"""Shared test setup: hypothesis profiles and K/V helpers for the engine-core tests.

Profiles (select with ``HYPOTHESIS_PROFILE``):

- ``ci`` (default): a fresh random seed every run (so each CI run explores new cases), printed
  in the session header and reused with ``HYPOTHESIS_SEED=N``; no example database, no
  deadline; the state machine runs a modest number of steps so
  ``tests/test_tree_state_machine.py`` stays well under 60 s on two cores.
- ``long``: random seeds, 2,000 state-machine runs of 50 steps = 100,000 steps in total.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings

from radixcache.core.pool import KVPool

settings.register_profile(
    "ci",
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile(
    "long",
    deadline=None,
    database=None,
    print_blob=True,
    max_examples=2_000,
    stateful_step_count=50,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
SEED = int(os.environ.get("HYPOTHESIS_SEED") or random.SystemRandom().randrange(2**32))
settings.load_profile(PROFILE)
# runs of each of the two tree state machines (50 steps each): 2 x 1,000 x 50 = 100,000 steps
STATE_MACHINE_RUNS = 1_000 if PROFILE == "long" else 40


def pytest_configure(config: pytest.Config) -> None:
    """Every hypothesis test of this run uses ``SEED`` (unless --hypothesis-seed is given)."""
    if config.getoption("hypothesis_seed", None) is None:
        config.option.hypothesis_seed = SEED


@pytest.fixture(autouse=True)
def _no_leaked_curve_keys():  # type: ignore[no-untyped-def]
    """A test that leaves ``$RADIXCACHE_CURVE_KEYS`` set (a command sets it for its process)
    would make every later test's sockets use its keys: fail that test, not forty others."""
    before = os.environ.get("RADIXCACHE_CURVE_KEYS")
    yield
    after = os.environ.get("RADIXCACHE_CURVE_KEYS")
    if after != before:
        os.environ.pop("RADIXCACHE_CURVE_KEYS", None)
        if before is not None:
            os.environ["RADIXCACHE_CURVE_KEYS"] = before
        pytest.fail(f"the test left RADIXCACHE_CURVE_KEYS={after!r} (was {before!r})")


def pytest_report_header(config: pytest.Config) -> str:
    """The seed, on top of the run (a failure is reproduced with it)."""
    return (f"hypothesis seed {config.getoption('hypothesis_seed')} "
            f"(rerun with HYPOTHESIS_SEED=<seed>; profile {PROFILE})")


def toks(seq: Sequence[int]) -> np.ndarray:
    """Token ids as the uint32 array the tree takes."""
    return np.asarray(seq, dtype=np.uint32)


def write_kv(pool: KVPool, table: Sequence[int], lo: int, tokens: Sequence[int]) -> None:
    """Write K = token id and V = token id + 0.5 at positions ``[lo, len(tokens))`` through
    ``table``, in every layer/head/dim (what a request's prefill would write)."""
    n, B = len(tokens), pool.block_size
    if lo >= n:
        return
    pos = torch.arange(lo, n)
    blocks = torch.tensor([table[p // B] for p in range(lo, n)])
    vals = torch.tensor([float(t) for t in tokens[lo:n]], dtype=pool.kv.dtype)
    pool.kv[:, 0, blocks, pos % B] = vals[None, :, None, None]
    pool.kv[:, 1, blocks, pos % B] = (vals + 0.5)[None, :, None, None]


def read_kv(pool: KVPool, table: Sequence[int], n: int) -> tuple[list[int], list[int]]:
    """Read positions ``[0, n)`` back through ``table``: (K of layer 0 head 0 dim 0 as ints,
    V - 0.5 as ints), every layer/head/dim checked equal to that value."""
    if n == 0:
        return [], []
    B = pool.block_size
    pos = torch.arange(n)
    blocks = torch.tensor([table[p // B] for p in range(n)])
    k = pool.kv[:, 0, blocks, pos % B]  # (L, n, H, D)
    v = pool.kv[:, 1, blocks, pos % B]
    k0 = k[0, :, 0, 0]
    v0 = v[0, :, 0, 0]
    assert bool((k == k0[None, :, None, None]).all()), "K differs across layers/heads"
    assert bool((v == v0[None, :, None, None]).all()), "V differs across layers/heads"
    return [int(x) for x in k0.tolist()], [int(x - 0.5) for x in v0.tolist()]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int) -> None:
    """On a failed run, say which hypothesis seed it ran with (the header is hidden by -q)."""
    if exitstatus != 0:
        seed = terminalreporter.config.getoption("hypothesis_seed")
        terminalreporter.write_line(f"hypothesis seed of this run: {seed} "
                                    f"(HYPOTHESIS_SEED={seed} reruns the same cases)")


def _cap_textual_idle_wait() -> None:
    """Textual's Pilot waits, after every key, until the process's CPU time stops advancing,
    for up to 1 s. A test app over a running engine never looks idle (its frame timer and the
    engine loop run), so every key cost 2 s of waiting. Tests wait for what they assert with
    ``wait_until``; the pilot still waits for every message queue to drain."""
    import textual.app
    import textual.pilot
    from textual._wait import wait_for_idle

    async def capped(min_sleep: float = 1 / 50, max_sleep: float = 1) -> None:
        await wait_for_idle(min_sleep, min(max_sleep, 0.1))

    textual.app.wait_for_idle = capped  # type: ignore[attr-defined]
    textual.pilot.wait_for_idle = capped  # type: ignore[attr-defined]


_cap_textual_idle_wait()
