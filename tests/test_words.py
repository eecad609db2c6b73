"""The command words come from one table: parsing, completion, help, the cluster screen and
the README read it, every local word has its handler, and every workload answers a mistake
with its usage (none can make ``parse`` raise)."""

from __future__ import annotations

from pathlib import Path

from inspector.cluster import ClusterApp
from inspector.commands import CommandReplies
from inspector.widgets.command_line import complete, parse
from inspector.widgets.help import help_text
from inspector.words import CLUSTER, LOCAL, Kind, cluster_words, main_words, readme_list
from radixcache.traffic.workloads import WORKLOADS
from radixcache.wire import commands as cmd

ROOT = Path(__file__).resolve().parent.parent


def test_the_main_screen_knows_every_workload_control_and_local_word() -> None:
    words = main_words()
    assert list(words) == [*WORKLOADS, *cmd.CONTROLS, *LOCAL]
    assert {w.kind for w in words.values() if w.word in WORKLOADS} == {Kind.WORKLOAD}
    assert list(cluster_words()) == [*WORKLOADS, *CLUSTER]


def test_each_local_word_has_its_handler() -> None:
    assert set(CommandReplies.LOCAL) == set(LOCAL)
    assert set(ClusterApp.WORDS) == set(CLUSTER)


def test_every_example_parses_and_every_workload_mistake_names_its_usage() -> None:
    for w in main_words().values():
        got = parse(w.example)
        assert got.error is None, w.example
        assert (got.local is not None) == (w.kind is Kind.LOCAL)
    for name, spec in WORKLOADS.items():
        assert parse(f"{name} x").error == (
            f"{name}: {spec.params[0].name} must be an integer, got 'x' "
            f"(usage: {spec.usage()} (e.g. {spec.example}))")


def test_completion_help_and_readme_read_the_table() -> None:
    assert complete("wat") == "watermark "
    assert complete("s") == "s"  # system, stats, snapshot
    assert complete("sn") == "snapshot "
    text = help_text()
    assert "chat 20 · system 50 · tot 3 4 · fork 8 · flood 500\n" in text
    assert ("evict 4096 · watermark 0.9 0.8 · pause · resume · reset · stats · snapshot · "
            "schedule lpm\n") in text
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert readme_list() in readme


def test_the_engine_parses_the_same_words_with_the_same_messages() -> None:
    assert cmd.parse_command_line("evict 4096") == cmd.Evict(4096)
    assert cmd.parse_command_line("WATERMARK 0.9 0.8") == cmd.SetWatermark(0.9, 0.8)
    assert cmd.parse_command_line("tot 3 4") == cmd.StartWorkload("tot", ["3", "4"])
    for line, message in [("evict -5", "usage: evict TOKENS (e.g. evict 4096)"),
                          ("watermark 0.8 0.9",
                           "watermark needs 0 < LOW <= HIGH <= 1, e.g. watermark 0.9 0.8"),
                          ("stats now", "stats takes no arguments")]:
        assert parse(line).error == message
        try:
            cmd.parse_command_line(line)
        except cmd.CommandError as err:
            assert str(err) == message
        else:
            raise AssertionError(line)
