"""Commands imported only when they run: ``radixcache --help`` lists them from ``COMMANDS``.

Every command module imports what its commands need (numpy, ZeroMQ, the engine's modules,
Textual): importing all of them for ``--help`` took 0.55 s on a quiet machine. A
``LazyGroup`` lists the table's commands with their summaries and imports a command's module
when the command is resolved (run, or asked for its own ``--help``). ``tests/test_cli.py``
checks the table against what the modules register (``load_all``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import ClassVar

import typer
from typer import _click as click  # the Click that Typer vendors: its groups hold these
from typer.core import TyperCommand, TyperGroup

COMMANDS: Mapping[str, tuple[str, str, str]] = MappingProxyType({
    # command path: (the module that registers it, its help panel ("": none), the summary
    # --help lists: the first paragraph of its help, checked by tests/test_cli.py)
    "load": ("cli.cmd_cluster", "Run",
        "Send a workload to URL over HTTP as text (next turns carry the real answers); print "
        "TTFT, throughput and the cached share of prompt tokens."),
    "cluster": ("cli.cmd_cluster", "Run",
        "Start N engine replicas behind sglang-router (127.0.0.1) and open the cluster screen; "
        "q stops every process it started. Send load with `radixcache load --url ROUTER`."),
    "demo": ("cli.cmd_demo", "Run",
        "Start an engine with a looping mixed workload and open the inspector on it."),
    "keys": ("cli.cmd_stream", "Run",
        "Write a CURVE server keypair and a client keypair (server.key, server.key_secret, "
        "client.key, client.key_secret; secrets mode 0600) for `serve --curve-keys DIR`. Copy "
        "server.key, client.key and client.key_secret to the machines that connect."),
    "serve": ("cli.cmd_stream", "Run",
        "Run the engine (model, radix cache, scheduler) in this process; serve its event "
        "stream, snapshots/replays and commands over ZeroMQ until SIGTERM or Ctrl-C."),
    "inspect": ("cli.cmd_inspect", "Inspect",
        "Open the inspector on a running engine, on a vLLM-format KV-event publisher, or (with "
        "no ENDPOINT) on an embedded in-process tree."),
    "replay": ("cli.cmd_inspect", "Inspect",
        "Replay a recording in the inspector: p play/pause, . step, , step back, < > keyframes, "
        "[ ] speed. A damaged file replays up to the damage and the replay bar says where."),
    "screenshot": ("cli.cmd_inspect", "Inspect",
        "Write SVG and PNG screenshots of the inspector: the live tree after a chat workload, "
        "the block map under eviction, the what-if and why screens, replay mode and the view "
        "attached to a vLLM-format publisher. PNGs need the Fira Code font (Debian: "
        "fonts-firacode)."),
    "tree": ("cli.cmd_recordings", "Inspect",
        "Print the cache tree of a recording or a live engine, or a KV-event block-hash tree. "
        "Damage in a file is reported on stderr (byte offset, reason); exit 1 when nothing "
        "could be read."),
    "record": ("cli.cmd_recordings", "Data",
        "Record a live engine (--from), or run a workload headless on the engine with the tiny "
        "model and record every step's events: 2000 chat requests take about 80 s on 2 CPU "
        "cores."),
    "export": ("cli.cmd_recordings", "Data",
        "Export a recording as JSON lines or a Perfetto/Chrome trace."),
    "whatif": ("cli.cmd_whatif", "Data",
        "The token hit rate of every cache size in one exact pass (LRU), and why requests miss."),
    "doctor": ("cli.cmd_doctor", "Diagnostics",
        "Show torch/CUDA, NVML, the ShareGPT dataset, ZeroMQ and where recordings go."),
    "soak": ("cli.cmd_soak", "Diagnostics",
        "Mixed workloads from several threads on a small pool; exit 1 on any violation."),
    "bench cli": ("cli.cmd_bench_cli", "",
        "The CLI's own speed: --help, tree FILE (time and peak memory), the demo's first output, "
        "first frame and quit, and whether record shows progress; each in a fresh process."),
    "bench events": ("cli.cmd_bench_events", "",
        "Events/s from a tree driver to a mirror in another process, and what publishing costs."),
    "bench tree": ("cli.cmd_bench_tree", "",
        "Replay the ShareGPT multi-turn trace through the tree and two baselines."),
    "bench whatif": ("cli.cmd_bench_whatif", "",
        "The ShareGPT curve at block 16 against one `bench tree` replay, its exactness against "
        "direct and real-tree replays, the inspector's follower on that trace's stream, and a "
        "generated 1M-request Mooncake-format trace."),
    "bench cluster": ("cli.cmd_cluster", "",
        "Every sglang-router policy on the chat workload over N replicas: hit rate, load "
        "imbalance, TTFT and the tokens cached on more than one replica."),
    "bench http": ("cli.cmd_cluster", "",
        "A hostile client against `serve --http`: /health latency while huge prompts are "
        "refused, clients that leave, a burst of concurrent requests, server RSS under huge "
        "words."),
    "bench engine": ("cli.cmd_engine", "",
        "Serve one workload with the cache on, then off; compare prefill work, TTFT, decode "
        "rate. With --schedule: the demo's mix under each scheduling policy (hit rate against "
        "the what-if curve, in-flight misses, queue wait, TTFT, throughput, equal outputs)."),
    "bench tui": ("cli.cmd_inspect", "",
        "The inspector headless on a big tree fed 50,000 events/s: frame cost while scrolling "
        "and while nodes change, key latency, events ingested/s, memory pane redraws/s, command "
        "reply time."),
})


def load_all() -> None:
    """Import every command module (tests, and anything that walks the whole command tree)."""
    for module, _, _ in COMMANDS.values():
        importlib.import_module(module)
    LazyGroup.finish()


def command_name(info: typer.models.CommandInfo) -> str:
    """The name a registered command is invoked by (Typer derives it from the function)."""
    if info.name:
        return info.name
    assert info.callback is not None
    return info.callback.__name__.lower().replace("_", "-")


class LazyGroup(TyperGroup):
    """A Typer group whose commands come from ``COMMANDS`` (those under ``prefix``): listed
    from the table, imported when resolved. Commands already registered when the group was
    built are used as they are."""

    prefix: ClassVar[str] = ""
    # set by ``cli.app`` once the apps exist: the Typer app commands register on, and what
    # finishes a command's help once registered (its panel, its example)
    typer_app: ClassVar[typer.Typer | None] = None
    finish: ClassVar[Callable[[], None]] = staticmethod(lambda: None)

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command of the table under this group, and the registered ones."""
        names = [p[len(self.prefix):] for p in COMMANDS if p.startswith(self.prefix)]
        names = [n for n in names if " " not in n]
        return list(dict.fromkeys([*names, *super().list_commands(ctx)]))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """A registered command, else a stand-in with the table's summary (for listings)."""
        found = super().get_command(ctx, cmd_name)
        entry = COMMANDS.get(self.prefix + cmd_name)
        if found is not None or entry is None:
            return found
        return TyperCommand(cmd_name, help=entry[2], rich_help_panel=entry[1] or None)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[
            str | None, click.Command | None, list[str]]:
        """Import the command's module first, so the real command runs."""
        if args and self.prefix + args[0] in COMMANDS and args[0] not in self.commands:
            self._load(args[0])
        return super().resolve_command(ctx, args)

    def _load(self, name: str) -> None:
        importlib.import_module(COMMANDS[self.prefix + name][0])
        LazyGroup.finish()
        assert self.typer_app is not None
        for info in self.typer_app.registered_commands:
            if command_name(info) == name:
                self.commands[name] = typer.main.get_command_from_info(
                    info, pretty_exceptions_short=self.typer_app.pretty_exceptions_short,
                    rich_markup_mode=self.typer_app.rich_markup_mode)


class RootCommands(LazyGroup):
    """``radixcache``'s commands."""


class BenchCommands(LazyGroup):
    """``radixcache bench``'s commands."""

    prefix = "bench "
