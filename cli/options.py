"""Options and helpers shared by the CLI's engine commands (`serve`, `record`, `demo`,
`cluster`): the model (seeded or a folder), its dtype, the pool's size."""

from __future__ import annotations

import enum
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from radixcache.serving.policy import SchedulePolicy

if TYPE_CHECKING:  # torch (seconds), numpy and the generators: imported when a command runs
    from radixcache.serving.engine import Answers, Engine, EngineConfig
    from radixcache.traffic.workloads import Workload

SCHEDULE_HELP = ("How waiting requests are admitted: fcfs (arrival order), lpm (longest cached "
                 "prefix first) or dfs-weight (depth-first over the cached tree); the last "
                 "two also hold a request whose prefix a running request is computing.")

RESERVE_HELP = ("How running requests hold KV blocks: grow (what they wrote and their next "
                "step's; admitted by expected need, retracted into the tree when a step finds "
                "no block) or full (the worst case, prompt + max_tokens, from admission on; the "
                "rule before growing leases, for comparison).")


class ReserveRule(enum.StrEnum):
    """The values of ``radixcache.serving.reserve.Reserve`` (imported when a command runs)."""

    FULL = "full"
    GROW = "grow"


CURVE_HELP = ("A key directory from `radixcache keys DIR`: CURVE-encrypt and authenticate "
              "(for non-loopback use).")


BLOCK_SIZE = 16  # the engine's block size (every command serves at 16)


class ModelSize(enum.StrEnum):
    """Which seeded model the engine runs (``--model`` may also name a model folder)."""

    TINY = "tiny"
    DEFAULT = "default"


class AnswerMode(enum.StrEnum):
    """How forced answers are computed: the values of ``radixcache.serving.server.Answers`` (which
    imports torch, so it is imported only when a command runs)."""

    DECODE = "decode"
    PREFILL = "prefill"


MODEL_HELP = ("tiny: 1 layer, d_model 32 (fast on a CPU); default: the 2-layer seeded model; or "
              "a local Hugging Face folder (config.json, *.safetensors, tokenizer.json: "
              "Llama, Qwen2, Qwen3), never downloaded.")
DTYPE_HELP = ("A model folder's dtype: auto (the config's on a GPU, float32 on the CPU), "
              "float32, bfloat16 or float16.")
KV_MEMORY_HELP = ("Size the pool from memory instead of --blocks: bytes (2GiB, 512MiB) or a "
                  "fraction of the device's free memory (0.5); blocks = memory / (layers x KV "
                  "heads x head dim x dtype bytes x 2 x 16).")
_UNITS = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 10**3, "mb": 10**6,
          "gb": 10**9, "b": 1}


def kv_memory_bytes(text: str, free_bytes: int | None) -> int:
    """``--kv-memory``: ``2GiB``-style bytes, or a fraction in (0, 1] of ``free_bytes``.
    Raises ``ValueError`` with the reason."""
    t = text.strip().lower()
    unit = next((u for u in _UNITS if t.endswith(u)), None)
    number = t[: -len(unit)] if unit else t
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"--kv-memory {text!r}: a size such as 2GiB or a fraction such "
                         "as 0.5") from None
    if unit is not None:
        if value <= 0:
            raise ValueError(f"--kv-memory {text!r} must be positive")
        return int(value * _UNITS[unit])
    if not 0 < value <= 1:
        raise ValueError(f"--kv-memory {text!r}: a fraction must be in (0, 1]")
    if free_bytes is None:
        raise ValueError("--kv-memory as a fraction needs a device that reports free memory "
                         "(a GPU); give a size such as 2GiB")
    return int(value * free_bytes)


def check_kv_memory(value: str | None) -> str | None:
    """``--kv-memory``'s callback: a value ``kv_memory_bytes`` cannot read is a usage error
    before anything starts (a fraction's device is asked when the engine is built)."""
    if value is not None:
        import typer

        try:
            kv_memory_bytes(value, 1)
        except ValueError as exc:
            raise typer.BadParameter(str(exc).removeprefix("--kv-memory ")) from None
    return value


def kv_memory_args(value: str | None) -> tuple[str, ...]:
    """``serve``'s arguments for ``--kv-memory`` (what ``demo`` and ``cluster`` pass on)."""
    return () if value is None else ("--kv-memory", value)


def engine_config(model: str, blocks: int, device: str | None, threads: int,
                  answers: Answers, schedule: SchedulePolicy = SchedulePolicy.FCFS, *,
                  dtype: str = "auto", kv_memory: str | None = None,
                  step_tokens: int = 512,
                  reserve: ReserveRule = ReserveRule.GROW) -> EngineConfig:
    """The engine's configuration for these options (sets torch's CPU threads). ``model`` is
    ``tiny``, ``default`` or a model folder; ``step_tokens`` the per-step token budget,
    ``reserve`` the lease rule. Raises ``ValueError`` (``CheckpointError``) with one line for
    a folder it cannot serve or a bad ``kv_memory``."""
    import torch

    from radixcache.serving.checkpoint import Checkpoint, choose_dtype, read_spec
    from radixcache.serving.engine import EngineConfig
    from radixcache.serving.model import ModelConfig, resolve_device, tiny_model
    from radixcache.serving.reserve import Reserve

    torch.set_num_threads(threads)
    checkpoint = None
    mc = tiny_model() if model == ModelSize.TINY else ModelConfig()
    dev = resolve_device(device)
    choose_dtype(dtype, None, dev)  # a bad name fails here, before anything loads
    if model not in (ModelSize.TINY, ModelSize.DEFAULT):
        checkpoint = Checkpoint(model, dtype)
        if not Path(model).is_dir():
            raise ValueError(f"--model {model!r}: not tiny, default or a model folder")
    if kv_memory is not None:
        shape = (read_spec(Path(model), dtype, dev).decoder_shape() if checkpoint else None)
        layers, heads, dim, dt = ((shape.n_layers, shape.n_kv_heads, shape.head_dim, shape.dtype)
                                  if shape else (mc.n_layers, mc.n_kv_heads, mc.head_dim,
                                                 mc.dtype))
        per_block = layers * heads * dim * dt.itemsize * 2 * BLOCK_SIZE
        free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else None
        blocks = max(1, kv_memory_bytes(kv_memory, free) // per_block)
    return EngineConfig(num_blocks=blocks, model=mc, device=device, answers=answers,
                        schedule=schedule, checkpoint=checkpoint, max_step_tokens=step_tokens,
                        reserve=Reserve(reserve.value))


def model_args(model: str, dtype: str) -> tuple[str, ...]:
    """``serve``'s arguments for this model (what ``demo`` and ``cluster`` start it with):
    none for the seeded default, so their command lines stay as they were."""
    if model == ModelSize.TINY and dtype == "auto":
        return ()
    return ("--model", str(Path(model).resolve()) if Path(model).is_dir() else model,
            "--dtype", dtype)


def checked_engine(model: str, blocks: int, device: str | None, threads: int,
                   answers: Answers, schedule: SchedulePolicy = SchedulePolicy.FCFS, *,
                   dtype: str = "auto", kv_memory: str | None = None,
                   step_tokens: int = 512, reserve: ReserveRule = ReserveRule.GROW) -> Engine:
    """The engine for these options (``engine_config``); a folder it cannot serve or a bad
    option exits 2 with one line on stderr."""
    import typer

    from radixcache.serving.engine import Engine

    try:
        return Engine(engine_config(model, blocks, device, threads, answers, schedule,
                                    dtype=dtype, kv_memory=kv_memory,
                                    step_tokens=step_tokens, reserve=reserve))
    except (ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def sized_workload(name: str, args: str, requests: int) -> Workload:
    """``name`` built from ``args``, or (no args) sized by its ``size`` parameter to hold at
    least ``requests``."""
    from radixcache.traffic.workloads import WORKLOADS, build_workload

    spec = WORKLOADS.get(name)
    if args or spec is None or spec.size is None:
        return build_workload(name, shlex.split(args))
    high = next(p.high for p in spec.params if p.name == spec.size)
    return build_workload(name, {spec.size: min(requests, high)})
