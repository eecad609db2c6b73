"""Options and helpers shared by the CLI's engine commands (`serve`, `record`)."""

from __future__ import annotations

import enum
import shlex
from typing import TYPE_CHECKING

from radixcache.serving.policy import SchedulePolicy

if TYPE_CHECKING:  # torch (seconds), numpy and the generators: imported when a command runs
    from radixcache.serving.engine import Answers, EngineConfig
    from radixcache.traffic.workloads import Workload

SCHEDULE_HELP = ("How waiting requests are admitted: fcfs (arrival order), lpm (longest cached "
                 "prefix first) or dfs-weight (depth-first over the cached tree); the last "
                 "two also hold a request whose prefix a running request is computing.")

RESERVE_HELP = ("How running requests hold KV blocks: full (the worst case, prompt + max_tokens, "
                "from admission on) or grow (what they wrote and their next step's; admitted by "
                "expected need, retracted into the tree when a step finds no block).")


class ReserveRule(enum.StrEnum):
    """The values of ``radixcache.serving.reserve.Reserve`` (imported when a command runs)."""

    FULL = "full"
    GROW = "grow"


CURVE_HELP = ("A key directory from `radixcache keys DIR`: CURVE-encrypt and authenticate "
              "(for non-loopback use).")


class ModelSize(enum.StrEnum):
    """Which model the engine runs."""

    TINY = "tiny"
    DEFAULT = "default"


class AnswerMode(enum.StrEnum):
    """How forced answers are computed: the values of ``radixcache.serving.server.Answers`` (which
    imports torch, so it is imported only when a command runs)."""

    DECODE = "decode"
    PREFILL = "prefill"


def engine_config(model: ModelSize, blocks: int, device: str | None, threads: int,
                  answers: Answers, schedule: SchedulePolicy = SchedulePolicy.FCFS,
                  reserve: ReserveRule = ReserveRule.FULL) -> EngineConfig:
    """The engine's configuration for these options (sets torch's CPU threads)."""
    import torch

    from radixcache.serving.engine import EngineConfig
    from radixcache.serving.model import ModelConfig, tiny_model
    from radixcache.serving.reserve import Reserve

    torch.set_num_threads(threads)
    mc = tiny_model() if model is ModelSize.TINY else ModelConfig()
    return EngineConfig(num_blocks=blocks, model=mc, device=device, answers=answers,
                        schedule=schedule, reserve=Reserve(reserve.value))


def sized_workload(name: str, args: str, requests: int) -> Workload:
    """``name`` built from ``args``, or (no args) sized by its ``size`` parameter to hold at
    least ``requests``."""
    from radixcache.traffic.workloads import WORKLOADS, build_workload

    spec = WORKLOADS.get(name)
    if args or spec is None or spec.size is None:
        return build_workload(name, shlex.split(args))
    high = next(p.high for p in spec.params if p.name == spec.size)
    return build_workload(name, {spec.size: min(requests, high)})
