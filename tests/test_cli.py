"""The CLI as a new user meets it: help with examples, panels, --version, exit codes, demo."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.models import DefaultPlaceholder
from typer.testing import CliRunner

import cli.cmd_demo as demo_mod
from cli.app import PANELS, app, bench_app, command_name
from cli.lazy import COMMANDS, load_all
from cli.main import main
from radixcache import __version__
from radixcache.tools.demo import DemoError
from radixcache.traffic.workloads import build_workload

RUNNER = CliRunner()
load_all()  # every command registered, so the walks below see them all


def _command_paths() -> list[list[str]]:
    """Every command and group, found by walking the Click tree Typer builds."""
    paths: list[list[str]] = []

    def walk(command: object, path: list[str]) -> None:
        paths.append(path)
        commands: dict[str, object] = getattr(command, "commands", {})  # a group's commands
        for name, sub in commands.items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return paths


def _leaf_paths() -> list[list[str]]:
    group_paths: list[list[str]] = [[], ["bench"]]
    return [p for p in _command_paths() if p not in group_paths]


def test_the_lazy_table_says_what_each_module_registers() -> None:
    """``radixcache --help`` lists commands from ``cli.lazy.COMMANDS`` without importing
    their modules: the table names each command's module, panel and first help paragraph."""
    found: dict[str, tuple[str, str, str]] = {}
    for prefix, typer_app in (("", app), ("bench ", bench_app)):
        for info in typer_app.registered_commands:
            cmd = typer.main.get_command_from_info(info, pretty_exceptions_short=True,
                                                   rich_markup_mode="rich")
            first = " ".join((cmd.help or "").split("\n\n")[0].split())
            panel = info.rich_help_panel
            assert info.callback is not None
            found[prefix + command_name(info)] = (
                info.callback.__module__, "" if isinstance(panel, DefaultPlaceholder) else panel,
                first)
    assert found == dict(COMMANDS)


def test_root_help_imports_no_command_module() -> None:
    code = ("import sys; from cli.main import main\n"
            "try: main(['--help'])\n"
            "except SystemExit: pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('cli.cmd_')), "
            "'numpy' in sys.modules, 'zmq' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    assert done.stderr.strip().splitlines()[-1] == "[] False False"


def test_the_walk_finds_the_commands_registered_today() -> None:
    leaves = {" ".join(p) for p in _leaf_paths()}
    assert {"demo", "serve", "record", "export", "tree", "doctor", "bench tree",
            "bench engine", "bench events"} <= leaves


@pytest.mark.parametrize("path", _command_paths(), ids=lambda p: " ".join(p) or "radixcache")
def test_help_exits_0(path: list[str]) -> None:
    for flag in ("--help", "-h"):
        result = RUNNER.invoke(app, [*path, flag])
        assert result.exit_code == 0, result.output
        assert "Usage:" in result.output


@pytest.mark.parametrize("path", _leaf_paths(), ids=" ".join)
def test_every_command_help_shows_an_example(path: list[str]) -> None:
    result = RUNNER.invoke(app, [*path, "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert "Example" in result.output, f"radixcache {' '.join(path)} --help has no example"
    assert f"radixcache {' '.join(path)}" in result.output.split("Example", 1)[1]


def test_every_top_level_command_has_a_help_panel() -> None:
    for info in app.registered_commands:
        assert info.rich_help_panel in set(PANELS.values()), command_name(info)
    assert [g.rich_help_panel for g in app.registered_groups] == ["Benchmarks"]
    assert all(isinstance(info.rich_help_panel, DefaultPlaceholder)
               for info in bench_app.registered_commands)


def test_root_help_groups_commands_into_panels_and_keeps_completion() -> None:
    out = RUNNER.invoke(app, ["--help"], terminal_width=120).output
    titles = [line.split("─", 2)[1].strip() for line in out.splitlines()
              if line.startswith("╭─")]
    assert titles == ["Options", "Run", "Inspect", "Data", "Diagnostics", "Benchmarks"]
    assert "--install-completion" in out
    assert "--show-completion" in out
    assert "-h" in out


def test_version_is_exact() -> None:
    result = RUNNER.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"radixcache {__version__}\n"


def _run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out, err = capsys.readouterr()
    code = exit_info.value.code
    return (code if isinstance(code, int) else 1), out, err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run_main(["bench", "tree", "--capacity", "0"], capsys)
    assert code == 2
    assert "Invalid value for '--capacity'" in err
    assert _run_main(["no-such-command"], capsys)[0] == 2
    assert _run_main(["demo", "--mix", "nope 3"], capsys)[0] == 2


def test_a_missing_recording_exits_1_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run_main(["tree", "/nonexistent.rcx"], capsys)
    assert code == 1
    lines = (out + err).strip().splitlines()
    assert len(lines) == 1
    assert "/nonexistent.rcx" in lines[0]
    assert "Traceback" not in out + err


def test_an_uncaught_runtime_error_is_one_line_on_stderr(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RADIXCACHE_DEBUG", raising=False)
    code, out, err = _run_main(["tree", "tcp://127.0.0.1"], capsys)
    assert (code, out) == (1, "")
    assert err == "error: expected tcp://HOST:PORT or ipc://PATH, got 'tcp://127.0.0.1'\n"


def test_radixcache_debug_shows_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXCACHE_DEBUG", "1")
    with pytest.raises(ValueError, match="expected tcp://HOST:PORT"):
        main(["tree", "tcp://127.0.0.1"])


# -- demo -----------------------------------------------------------------------------------
def _requests(line: str, seed: int) -> int:
    name, *args = line.split()
    return len(build_workload(name, [*args, "--seed", str(seed)]).requests)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_headless_demo_runs_an_engine_process_and_leaves_nothing_behind(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    engines: list[demo_mod.EngineProcess] = []
    original = demo_mod.EngineProcess.start

    def start(self: demo_mod.EngineProcess) -> demo_mod.EngineProcess:
        engines.append(self)
        return original(self)

    monkeypatch.setattr(demo_mod.EngineProcess, "start", start)
    mix = "tot 2 3,fork 4"
    code, out, _ = _run_main(["demo", "--no-inspect", "--seconds", "1.5", "--interval", "0.3",
                              "--mix", mix, "--json"], capsys)
    assert code == 0
    stats = json.loads(out)
    (engine,) = engines
    assert engine.proc is not None
    assert engine.proc.returncode == 0  # stopped by SIGTERM, exited cleanly
    assert not _pid_alive(engine.proc.pid)
    assert not engine.dir.exists()
    lines = mix.split(",")
    sent = stats["workloads_sent"]
    assert sent >= 2
    expected = sum(_requests(lines[i % 2], i // 2) for i in range(sent))
    assert stats["served"] + stats["queued"] == expected
    assert stats["mirror_nodes"] == stats["nodes"]
    assert stats["resyncs"] == 0
    causes = stats["missed_tokens_by_cause"]
    assert set(causes) == {"evicted", "never seen", "diverged inside a block", "capacity",
                           "in flight", "last prompt token", "not followed"}
    assert causes["never seen"] > 0  # the first requests of a fresh engine
    assert 0 <= stats["measured_hit_rate"] <= 1 and 0 <= stats["predicted_hit_rate"] <= 1


class _Stubborn(demo_mod.EngineProcess):
    """An "engine" that ignores SIGTERM (stop must escalate to SIGKILL)."""

    def command(self) -> list[str]:
        return [sys.executable, "-c", "import signal, time; "
                "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
                "time.sleep(60)"]


def test_stop_kills_an_engine_that_ignores_sigterm() -> None:
    engine = _Stubborn(16, grace_s=0.3).start()
    assert engine.proc is not None
    while engine.log.read_text() != "up\n":
        assert engine.proc.poll() is None
    assert engine.stop() == -signal.SIGKILL
    assert not engine.dir.exists()


class _Crashing(demo_mod.EngineProcess):
    def command(self) -> list[str]:
        return [sys.executable, "-c", "import sys; print('error: port in use', file=sys.stderr);"
                "sys.exit(1)"]


def test_an_engine_that_exits_early_is_a_one_line_error_and_its_log_is_kept(
        capsys: pytest.CaptureFixture[str]) -> None:
    with _Crashing(16) as engine, pytest.raises(DemoError) as info:
        engine.start().wait_ready(timeout_s=20)
    assert str(info.value) == "the engine exited before it answered: error: port in use"
    assert not Path(engine.dir).exists()
    kept = engine.dir.parent / f"{engine.dir.name}-engine.log"
    try:
        assert kept.read_text() == "error: port in use\n"
        assert capsys.readouterr().err == f"the engine exited with status 1; its log: {kept}\n"
    finally:
        kept.unlink(missing_ok=True)


def test_demo_stops_its_engine_when_the_inspector_raises(
        monkeypatch: pytest.MonkeyPatch) -> None:
    engines: list[demo_mod.EngineProcess] = []
    monkeypatch.setattr(demo_mod, "EngineProcess", _recording(engines))

    def broken_inspector(engine: demo_mod.EngineProcess, mix: object, interval: float) -> None:
        raise RuntimeError("inspector crashed")

    monkeypatch.setattr(demo_mod, "_run_inspector", broken_inspector)
    with pytest.raises(RuntimeError, match="inspector crashed"):
        demo_mod.demo(no_inspect=False, seconds=1.0, blocks=64, mix="fork 2", interval=0.5,
                      as_json=False, schedule=demo_mod.DEMO_SCHEDULE, model="tiny", dtype="auto",
                      kv_memory=None, reserve=demo_mod.ReserveRule.FULL)
    (engine,) = engines
    # the inspector starts at once, so the engine may still be importing when it is stopped
    assert engine.proc is not None and engine.proc.returncode in (0, -signal.SIGTERM)
    assert not engine.dir.exists()


def _recording(engines: list[demo_mod.EngineProcess]) -> type[demo_mod.EngineProcess]:
    class Recorded(demo_mod.EngineProcess):
        def start(self) -> demo_mod.EngineProcess:
            engines.append(self)
            return super().start()

    return Recorded


def test_engine_command_is_radixcache_serve_on_private_ipc() -> None:
    engine = demo_mod.EngineProcess(512)
    try:
        assert engine.command() == [sys.executable, "-m", "cli.main", "serve", "--ipc",
                                    str(engine.dir / "engine"), "--blocks", "512",
                                    "--schedule", "fcfs", "--reserve", "grow"]
        assert engine.endpoints.events == f"ipc://{engine.dir}/engine-events"
    finally:
        engine.stop()
    assert not engine.dir.exists()


def test_serve_help_keeps_the_extras_name() -> None:
    """Rich markup took ``[http]`` for a style tag and printed "needs radixcache."."""
    out = RUNNER.invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output
    assert "(on --endpoint-host; needs radixcache[http])." in " ".join(out.split())
