"""What ``radixcache --help`` shows, as data that imports nothing: the command table (each
command's module, help panel and summary), the root's help and epilog, the bench group's help.

``cli.app`` builds the Typer apps from these, ``cli.lazy`` lists and imports commands from
``COMMANDS``, and ``cli.tophelp`` prints the root's help from them without importing Typer.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

ROOT_HELP = (
    "A token-granular radix-tree KV cache engine and its live terminal inspector.\n\n"
    "Start with [bold]radixcache demo[/]: an engine with a mixed workload and the "
    "inspector attached to it."
)
ROOT_EPILOG = ("Exit codes: 0 ok, 1 runtime error, 2 usage error. RADIXCACHE_DEBUG=1 shows "
               "tracebacks.")
VERSION_HELP = "Print the version and exit."
BENCH_HELP = "Benchmarks: each prints a table, or one JSON object with --json."
BENCH_PANEL = "Benchmarks"

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
    "tree": ("cli.cmd_tree", "Inspect",
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
        "imbalance, TTFT and the tokens cached on more than one replica; then the faults: "
        "requests failed across a router kill and a replica kill (openai clients, default "
        "retries) and the supervisor's restarts."),
    "bench http": ("cli.cmd_cluster", "",
        "A hostile client against `serve --http`: /health latency while huge prompts are "
        "refused, clients that leave, a burst of concurrent requests, server RSS under huge "
        "words."),
    "bench engine": ("cli.cmd_engine", "",
        "Serve one workload with the cache on, then off; compare prefill work, TTFT, decode "
        "rate. With --schedule: the demo's mix under each scheduling policy (hit rate against "
        "the what-if curve, in-flight misses, queue wait, TTFT, throughput, equal outputs)."),
    "bench model": ("cli.cmd_bench_model", "",
        "A random checkpoint with SmolLM2-135M's shapes on the radix cache against "
        "transformers' generate, on the multi-turn chat workload: TTFT, prefill and decode "
        "tokens/s per turn, requests/s."),
    "bench serve": ("cli.cmd_bench_serve", "",
        "The chat workload through `serve --http` (a child process, streaming HTTP clients) "
        "beside the same workload in process, at each rate and at saturation: TTFT and "
        "inter-token latency p50/p99, requests/s, CPU seconds per request."),
    "bench tui": ("cli.cmd_inspect", "",
        "The inspector headless on a big tree fed 50,000 events/s: frame cost while scrolling "
        "and while nodes change, key latency, events ingested/s, memory pane redraws/s, command "
        "reply time."),
})
