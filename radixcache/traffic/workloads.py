"""The workload registry: each named generator (``traffic.generators``) with its parameters,
and the parsing of command-line style arguments into a built ``Workload``.

The types live in ``traffic.workload_types`` and the generators in ``traffic.generators``;
both are re-exported here, so ``from radixcache.traffic.workloads import ...`` finds them all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from radixcache.traffic.generators import GEN_PROMPT as GEN_PROMPT
from radixcache.traffic.generators import chat as chat
from radixcache.traffic.generators import flood as flood
from radixcache.traffic.generators import fork as fork
from radixcache.traffic.generators import fork_offsets as fork_offsets
from radixcache.traffic.generators import system as system
from radixcache.traffic.generators import tot as tot
from radixcache.traffic.generators import tot_request_count as tot_request_count
from radixcache.traffic.workload_types import FORK_BASE_TOKENS as FORK_BASE_TOKENS
from radixcache.traffic.workload_types import FORK_BLOCK as FORK_BLOCK
from radixcache.traffic.workload_types import MAX_REQUESTS as MAX_REQUESTS
from radixcache.traffic.workload_types import SYNTHETIC_SOURCE as SYNTHETIC_SOURCE
from radixcache.traffic.workload_types import WORDS as WORDS
from radixcache.traffic.workload_types import TokenText as TokenText
from radixcache.traffic.workload_types import Vocabulary as Vocabulary
from radixcache.traffic.workload_types import Workload as Workload
from radixcache.traffic.workload_types import WorkloadError as WorkloadError
from radixcache.traffic.workload_types import WorkloadRequest as WorkloadRequest

# --- the registry and argument parsing ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One integer parameter: its name, default and inclusive bounds."""

    name: str
    default: int
    low: int
    high: int
    help: str


SEED = ParamSpec("seed", 0, 0, 2**32 - 1, "random seed")


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A workload as the command line knows it: positional ``params`` in order, then ``--seed``;
    an ``example`` line; ``unit``, where its request count comes from in its own unit (the
    built parameters and the request count); ``size``, the parameter that scales it to a
    number of requests (``serve --requests``), if one does."""

    name: str
    help: str
    params: tuple[ParamSpec, ...]
    builder: Callable[..., Workload]
    example: str
    unit: Callable[[Mapping[str, int], int], str] | None = None
    size: str | None = None
    count: Callable[[Mapping[str, int]], int] | None = None  # requests, when known up front

    @property
    def all_params(self) -> tuple[ParamSpec, ...]:
        """The positional parameters, then ``seed``."""
        return (*self.params, SEED)

    def usage(self) -> str:
        """One line such as ``tot DEPTH BRANCHING [--seed N]``."""
        return " ".join((self.name, *(p.name.upper() for p in self.params), "[--seed N]"))

    def explain(self, params: Mapping[str, int], requests: int) -> str:
        """Where ``requests`` comes from, in the workload's unit (``20 conversations (every
        turn is a request)``, ``tree of thought 1 + 4 + 16 + 64``)."""
        if self.unit is None:
            return f"{requests:,} {self.name} requests"
        return self.unit(params, requests)


def _tot_unit(p: Mapping[str, int], _: int) -> str:
    b, d = p["branching"], p["depth"]
    return "tree of thought " + " + ".join(f"{b ** i:,}" for i in range(d + 1))


WORKLOADS: Mapping[str, WorkloadSpec] = MappingProxyType(
    {
        "chat": WorkloadSpec(
            "chat",
            "ShareGPT multi-turn conversations (synthetic when the dataset is not installed)",
            (ParamSpec("conversations", 20, 1, 1000, "conversations to replay"),),
            chat,
            "chat 20",
            lambda p, _: f"{p['conversations']:,} conversations (every turn is a request)",
            size="conversations",
        ),
        "system": WorkloadSpec(
            "system",
            "many users behind one long shared system prompt; a few ask twice",
            (
                ParamSpec("users", 50, 1, 5000, "users, one question each"),
                ParamSpec("system_tokens", 512, 8, 16384, "tokens of the shared system prompt"),
            ),
            system,
            "system 50",
            lambda p, n: f"{p['users']:,} users' first questions + {n - p['users']:,} second "
            "questions",
            size="users",
        ),
        "tot": WorkloadSpec(
            "tot",
            "tree of thought: every node branches into children that extend its full text",
            (
                ParamSpec("depth", 3, 0, 100, "levels below the root"),
                ParamSpec("branching", 4, 1, 100, "children per node"),
            ),
            tot,
            "tot 3 4",
            _tot_unit,
            count=lambda p: tot_request_count(p["depth"], p["branching"]),
        ),
        "fork": WorkloadSpec(
            "fork",
            "speculative branches leaving one prompt inside blocks (copy-on-write)",
            (ParamSpec("branches", 8, 1, 1000, "branches off the base prompt"),),
            fork,
            "fork 8",
            lambda p, _: f"1 base + {p['branches']:,} branches",
        ),
        "flood": WorkloadSpec(
            "flood",
            "unique random prompts with no shared prefix, to force eviction",
            (ParamSpec("requests", 500, 1, MAX_REQUESTS, "prompts"),),
            flood,
            "flood 500",
            size="requests",
        ),
    }
)


def _spec(name: str) -> WorkloadSpec:
    spec = WORKLOADS.get(name)
    if spec is None:
        raise WorkloadError(f"unknown workload {name!r} (known: {', '.join(WORKLOADS)})")
    return spec


def _set(values: dict[str, int], spec: WorkloadSpec, param: ParamSpec, raw: str | int) -> None:
    """Parse, range-check and store one value."""
    if param.name in values:
        raise WorkloadError(f"{spec.name}: {param.name} given twice")
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise WorkloadError(f"{spec.name}: {param.name} must be an integer, got {raw!r}")
    try:
        value = int(raw)
    except ValueError:
        raise WorkloadError(f"{spec.name}: {param.name} must be an integer, got {raw!r}") from None
    if not param.low <= value <= param.high:
        raise WorkloadError(
            f"{spec.name}: {param.name} must be between {param.low} and {param.high}, got {value}"
        )
    values[param.name] = value


def _option(spec: WorkloadSpec, key: str) -> ParamSpec:
    for param in spec.all_params:
        if param.name == key:
            return param
    options = ", ".join(f"--{p.name}" for p in spec.all_params)
    raise WorkloadError(f"{spec.name}: unknown option --{key} (options: {options})")


def _parse_args(spec: WorkloadSpec, args: Sequence[str]) -> dict[str, int]:
    """Positional ints in declared order, ``--name value`` or ``--name=value`` for any."""
    values: dict[str, int] = {}
    positional = iter(spec.params)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            key, sep, raw = arg[2:].partition("=")
            param = _option(spec, key)
            if not sep:
                if i + 1 >= len(args):
                    raise WorkloadError(f"{spec.name}: option --{key} needs a value")
                i += 1
                raw = args[i]
        else:
            param = next(positional, SEED)
            if param is SEED:
                names = ", ".join(p.name for p in spec.params)
                plural = "" if len(spec.params) == 1 else "s"
                raise WorkloadError(
                    f"{spec.name} takes at most {len(spec.params)} positional argument{plural} "
                    f"({names}), got {sum(not a.startswith('--') for a in args)}"
                )
            raw = arg
        _set(values, spec, param, raw)
        i += 1
    return values


def _too_many(spec: WorkloadSpec, params: Mapping[str, int], count: int) -> WorkloadError:
    desc = " ".join(f"{p.name}={params[p.name]}" for p in spec.params)
    shown = f"{count:,}" if count < 10**12 else f"about 10^{len(str(count)) - 1}"
    return WorkloadError(
        f"{spec.name}: {desc} would make {shown} requests (at most {MAX_REQUESTS:,})"
    )


def build_workload(name: str, args: Sequence[str] | Mapping[str, int | str] = ()) -> Workload:
    """Build workload ``name`` from command-line style ``args`` or a name -> value mapping.

    Missing parameters take their defaults. Raises ``WorkloadError`` (with the message to
    show) for an unknown name, too many positional values, an unknown option, a non-integer,
    a value out of its bounds, or a workload of more than ``MAX_REQUESTS`` requests.
    """
    spec = _spec(name)
    if isinstance(args, Mapping):
        values: dict[str, int] = {}
        for key, raw in args.items():
            _set(values, spec, _option(spec, key), raw)
    else:
        values = _parse_args(spec, list(args))
    params = {p.name: values.get(p.name, p.default) for p in spec.all_params}
    if spec.count is not None and spec.count(params) > MAX_REQUESTS:
        raise _too_many(spec, params, spec.count(params))
    workload = spec.builder(**params)
    if len(workload.requests) > MAX_REQUESTS:
        raise _too_many(spec, params, len(workload.requests))
    return workload
