"""The soak run: a short one must find no violation and leave nothing locked."""

from __future__ import annotations

import json

from typer.testing import CliRunner

import cli.cmd_soak
from cli.app import app
from radixcache.tools.soak import Soak, SoakConfig, SoakReport


def test_five_second_soak_is_sound():
    cfg = SoakConfig(seconds=5.0, num_blocks=160, threads=3, check_every_s=0.4, reset_every=4)
    soak = Soak(cfg)
    r = soak.run()
    assert r.violations == []
    assert r.recoveries == 0
    # every submitted request ended exactly one way; none can be too large for 160 blocks
    assert r.requests + r.rejected + r.cancelled == r.submitted
    assert r.rejected == 0
    assert r.requests >= 20
    # the faults were injected on schedule: check n (1-based, not the final one) resets when
    # n % 4 == 0, else evicts when n is even
    injected = range(1, r.checks)
    assert r.resets == sum(n % 4 == 0 for n in injected) >= 1
    assert r.evictions == sum(n % 2 == 0 and n % 4 != 0 for n in injected) >= 1
    assert r.evicted_nodes >= 1  # the small pool evicts
    # nothing is left locked or reserved; the mirror built from events equals the tree
    assert r.final_locks == 0
    assert r.final_request_blocks == 0
    assert soak.mirror.digest() == soak.tree.digest()
    soak.tree.check()
    snap = soak.tree.snapshot()
    held = {b for n in snap.nodes for b in n.blocks}
    assert soak.engine.pool.allocator.used_count == len(held)


def _report(violations: list[str]) -> SoakReport:
    return SoakReport(3, 3, 0, 0, 1, 10, 2, 0, 0, 0, 0, 0.5, 4, 0, 0, 1.0, violations)


def test_cli_json_and_exit_code_on_violation(monkeypatch):
    runner = CliRunner()
    monkeypatch.setattr(cli.cmd_soak, "run_soak", lambda cfg, progress: _report([]))
    ok = runner.invoke(app, ["soak", "--seconds", "1", "--json"])
    assert ok.exit_code == 0
    out = json.loads(ok.stdout)
    assert (out["requests"], out["events"], out["checks"], out["violations"]) == (3, 10, 2, 0)
    assert out["seconds"] == 1.0
    monkeypatch.setattr(cli.cmd_soak, "run_soak", lambda cfg, progress: _report(["0.1s boom"]))
    bad = runner.invoke(app, ["soak", "--seconds", "1", "--json"])
    assert bad.exit_code == 1
    assert json.loads(bad.stdout)["violation_details"] == ["0.1s boom"]
    usage = runner.invoke(app, ["soak"])
    assert usage.exit_code == 2
    assert "give --minutes or --seconds" in usage.output
