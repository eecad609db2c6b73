"""`serve --http` takes PORT, HOST:PORT and [V6]:PORT (was: anything but a bare port was
"should be a valid integer"); a host beyond loopback is refused without --allow-remote."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import typer

from cli.cmd_stream import HttpAt, http_at
from radixcache.wire.endpoints import free_ports

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize(("value", "at"), [
    ("8000", HttpAt(None, 8000)), ("0", HttpAt(None, 0)),
    ("127.0.0.1:8000", HttpAt("127.0.0.1", 8000)), ("localhost:65535", HttpAt("localhost", 65535)),
    ("[::1]:8000", HttpAt("::1", 8000)), ("[fe80::1]:80", HttpAt("fe80::1", 80)),
])
def test_the_forms_read(value: str, at: HttpAt) -> None:
    assert http_at(value) == at


@pytest.mark.parametrize(("value", "error"), [
    ("70000", "port 70000 is outside 0-65535"),
    ("localhost:70000", "port 70000 is outside 0-65535"),
    ("::1:8000", "expected PORT, HOST:PORT or [IPv6]:PORT, got '::1:8000'"),
    ("[localhost]:80", "'localhost' in brackets is not an IPv6 address"),
    ("[127.0.0.1]:80", "'127.0.0.1' in brackets is not an IPv6 address"),
    ("host:", "expected PORT, HOST:PORT or [IPv6]:PORT, got 'host:'"),
    (":80", "expected PORT, HOST:PORT or [IPv6]:PORT, got ':80'"),
    ("-1", "expected PORT, HOST:PORT or [IPv6]:PORT, got '-1'"),
    ("http://127.0.0.1:80", "expected PORT, HOST:PORT or [IPv6]:PORT, got 'http://127.0.0.1:80'"),
])
def test_anything_else_is_refused_by_name(value: str, error: str) -> None:
    with pytest.raises(typer.BadParameter) as caught:
        http_at(value)
    assert caught.value.message == error


@pytest.mark.parametrize(("form", "url"), [
    ("127.0.0.1:{p}", "http://127.0.0.1:{p}"),
    ("localhost:{p}", "http://127.0.0.1:{p}"),
    pytest.param("[::1]:{p}", "http://[::1]:{p}", marks=pytest.mark.skipif(
        not _ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")),
])
def test_serve_answers_on_the_address_given(form: str, url: str) -> None:
    port = free_ports(1)
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--port",
                             str(free_ports(3)), "--http", form.format(p=port), "--blocks", "64"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = url.format(p=port)
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None:
            try:
                r = httpx.post(f"{base}/v1/completions", timeout=60,
                               json={"prompt": "where am I", "max_tokens": 2})
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "serve did not answer within 120 s"
                time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    host = form.format(p=port).rsplit(":", 1)[0]
    assert f"HTTP (OpenAI, SGLang) http://{host}:{port}" in out
    assert "warning" not in out and "Traceback" not in err


def test_a_host_beyond_loopback_needs_allow_remote_before_any_work() -> None:
    p = subprocess.run([sys.executable, "-m", "cli.main", "serve", "--http", "0.0.0.0:8000"],
                       env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.splitlines() == [
        "error: refusing to bind HTTP 0.0.0.0:8000: only loopback unless explicitly allowed "
        "(pass --allow-remote to bind a non-loopback address)"]
