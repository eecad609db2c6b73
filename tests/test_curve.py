"""CURVE authentication: real sockets on 127.0.0.1, a tree-driver Server with a key directory."""

from __future__ import annotations

import os
import stat
import time
import warnings
from pathlib import Path

import pytest
import zmq

from radixcache.serving.stats import Stats
from radixcache.wire import commands as cmd
from radixcache.wire.endpoints import BindPolicy, check_bind
from radixcache.wire.mirror import Mirror
from radixcache.wire.security import KEYS_ENV, ClientCurve, CurveError, CurveServer, create_keys
from radixcache.wire.subscriber import Subscriber
from tests.helpers.stream import tree_server

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")


def _wait(cond: object, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if callable(cond) and cond():
            return True
        time.sleep(0.02)
    return False


def test_keys_are_written_with_private_secrets_and_never_overwritten(tmp_path: Path) -> None:
    files = create_keys(tmp_path / "keys")
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == [
        "client.key", "client.key_secret", "server.key", "server.key_secret"]
    assert stat.S_IMODE(files.server_secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(files.client_secret.stat().st_mode) == 0o600
    with pytest.raises(CurveError, match="refusing to overwrite existing keys"):
        create_keys(tmp_path / "keys")
    with pytest.raises(CurveError, match="cannot read CURVE key"):
        ClientCurve.load(tmp_path / "nowhere")


def test_curve_policy_binds_any_address_with_an_authenticated_warning(tmp_path: Path) -> None:
    create_keys(tmp_path)
    server = CurveServer(tmp_path)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_bind("tcp://0.0.0.0:5557", BindPolicy.LOCAL_ONLY.with_curve(server.keys))
            check_bind("tcp://127.0.0.1:5557", BindPolicy.LOCAL_ONLY.with_curve(server.keys))
        assert len(caught) == 1
        assert "CURVE-encrypted and authenticated" in str(caught[0].message)
    finally:
        server.close()


def test_only_the_client_key_in_the_directory_is_served(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEYS_ENV, raising=False)
    create_keys(tmp_path / "keys")
    create_keys(tmp_path / "other")
    good = ClientCurve.load(tmp_path / "keys")
    other = ClientCurve.load(tmp_path / "other")
    wrong = ClientCurve(good.server_public, other.public, other.secret)  # right server, bad key
    server = tree_server(512, curve_keys=tmp_path / "keys",
                         kv_endpoints=("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")).start()
    ep = server.publisher.endpoints
    assert server.kv is not None
    bound = [server.publisher._pub, server.publisher._control, server.publisher._command,
             server.kv._pub, server.kv._replay]
    assert [s.getsockopt(zmq.CURVE_SERVER) for s in bound] == [1] * 5
    subs = {name: Subscriber(ep, Mirror(16, 512), curve=keys, request_timeout_s=0.5).start()
            for name, keys in (("good", good), ("none", None), ("wrong", wrong))}
    try:
        reply = send(ep.commands, cmd.StartWorkload("chat", ["6", "--seed", "3"]), good)
        assert isinstance(reply, cmd.Ok)
        assert reply.message.startswith(f"chat: {reply.values['requests']} requests submitted (")
        for keys in (None, wrong):
            bad = send(ep.commands, cmd.Stats(), keys, timeout_s=1.0)
            assert isinstance(bad, cmd.Error)
            assert bad.message.startswith(f"no reply from {ep.commands} within 1 s")
        assert _wait(lambda: Stats.of(server.loop.command(cmd.Stats())).waiting == 0, 10)
        assert subs["good"].wait_synced(5)
        assert _wait(lambda: subs["good"].mirror.digest() == server.service.tree.digest(), 5)
        assert not subs["none"].synced.is_set() and not subs["wrong"].synced.is_set()
        assert subs["none"].stats.batches == 0 and subs["wrong"].stats.batches == 0
        stats = Stats.of(send(ep.commands, cmd.Stats(), good))  # still serving the good client
        assert stats.finished == server.service.counters().finished
    finally:
        for s in subs.values():
            s.stop()
        server.close()


def send(endpoint: str, c: cmd.AnyCommand, keys: ClientCurve | None,
         timeout_s: float = 5.0) -> cmd.AnyReply:
    from radixcache.wire.client import send_command

    return send_command(endpoint, c, timeout_s, curve=keys)


def test_inspect_with_several_endpoints_uses_the_curve_keys(tmp_path: Path, monkeypatch) -> None:
    """`inspect A B --curve-keys DIR` opens the cluster screen with the keys in force (every
    subscriber and command socket reads them), as one endpoint does; without an endpoint the
    option is refused."""
    import cli.cluster_screens
    from cli.main import main

    create_keys(tmp_path / "keys")
    monkeypatch.delenv(KEYS_ENV, raising=False)
    seen: list[ClientCurve | None] = []
    monkeypatch.setattr(cli.cluster_screens, "inspect_many",
                        lambda endpoints, curve: seen.append(curve))
    with pytest.raises(SystemExit) as exc:
        main(["inspect", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5567",
              "--curve-keys", str(tmp_path / "keys")])
    # the keys are handed over, not set in the environment for every later socket
    assert exc.value.code == 0 and seen == [ClientCurve.load(tmp_path / "keys")]
    assert KEYS_ENV not in os.environ
    with pytest.raises(SystemExit) as exc:
        main(["inspect", "--curve-keys", str(tmp_path / "keys")])
    assert exc.value.code == 2
