"""ZeroMQ CURVE authentication and encryption for an engine reachable from other machines.

A key directory (``radixcache keys DIR``) holds two keypairs written by
``zmq.auth.create_certificates``::

    DIR/server.key          server public key      (clients need it)
    DIR/server.key_secret   server secret key      (mode 0600; only the server needs it)
    DIR/client.key          client public key      (the server accepts every *.key in DIR)
    DIR/client.key_secret   client secret key      (mode 0600; the clients need it)

A server (``CurveServer``) makes every socket it binds a CURVE server and runs a ZAP
authenticator on ``zmq.Context.instance()`` that accepts only the public keys found in DIR; a
client (``ClientCurve``) sets the server's public key and its own keypair on each socket before
connecting. A client without the right keys completes no handshake: it receives nothing.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import NamedTuple

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

KEYS_ENV = "RADIXCACHE_CURVE_KEYS"  # clients built without explicit keys read DIR from here
SECRET_MODE = 0o600


class CurveError(ValueError):
    """CURVE cannot be used: no support in this libzmq, or a key file missing or unreadable."""


class KeyFiles(NamedTuple):
    """The four files of a key directory."""

    server_public: Path
    server_secret: Path
    client_public: Path
    client_secret: Path

    @classmethod
    def in_dir(cls, directory: Path) -> KeyFiles:
        """The file names ``radixcache keys`` writes in ``directory`` (they may not exist)."""
        return cls(directory / "server.key", directory / "server.key_secret",
                   directory / "client.key", directory / "client.key_secret")


def require_curve() -> None:
    """Raise ``CurveError`` unless this pyzmq/libzmq build supports CURVE."""
    if not zmq.has("curve"):
        raise CurveError(f"this libzmq {zmq.zmq_version()} was built without CURVE support "
                         "(zmq.has('curve') is False): --curve-keys cannot be used")


def create_keys(directory: Path) -> KeyFiles:
    """Write a server and a client keypair into ``directory`` (created, mode 0700) with the
    secret files at mode 0600. Refuses (``CurveError``) to overwrite existing keys: every
    client holding the old ones would be locked out. Each file is created new (``O_EXCL``:
    a link or anything else already at a name is refused, never written through), the
    secrets at 0600 before a byte of them is written; a failed write (a full disk) removes
    the four files: a key set is whole or absent. Every failure is one ``CurveError`` line."""
    require_curve()
    files = KeyFiles.in_dir(directory)
    present = [str(p) for p in files if p.exists() or p.is_symlink()]
    if present:
        raise CurveError(f"refusing to overwrite existing keys: {', '.join(present)}")
    if directory.exists() and not directory.is_dir():
        raise CurveError(f"{directory}: not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise CurveError(f"cannot create {directory}: {exc.strerror or exc}") from None
    made: list[Path] = []
    try:
        for path in files:  # public keys 0666 less the umask, as open() makes them
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                             SECRET_MODE if path.name.endswith("_secret") else 0o666))
            made.append(path)
        for name in ("server", "client"):
            zmq.auth.create_certificates(directory, name)
    except OSError as exc:
        for path in made:
            with contextlib.suppress(OSError):
                path.unlink()
        raise CurveError(f"cannot write keys in {directory}: {exc.strerror or exc} "
                         f"(none written)") from None
    return files


def _load(path: Path, *, secret: bool) -> tuple[bytes, bytes]:
    try:
        public, secret_key = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise CurveError(f"cannot read CURVE key {path}: {exc}") from None
    if secret and secret_key is None:
        raise CurveError(f"{path} holds no secret key")
    return public, secret_key or b""


class ServerKeys(NamedTuple):
    """The server's keypair (z85); ``apply`` makes a socket a CURVE server."""

    public: bytes
    secret: bytes

    def apply(self, sock: zmq.Socket[bytes]) -> None:
        """Set ``curve_server`` and the keys; call before ``bind``."""
        sock.curve_server = True
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


class ClientCurve(NamedTuple):
    """What a client needs: the server's public key and the client's keypair (z85)."""

    server_public: bytes
    public: bytes
    secret: bytes

    @classmethod
    def load(cls, directory: Path) -> ClientCurve:
        """Read ``server.key`` and ``client.key_secret`` from ``directory`` (``CurveError``)."""
        require_curve()
        files = KeyFiles.in_dir(directory)
        server_public, _ = _load(files.server_public, secret=False)
        public, secret = _load(files.client_secret, secret=True)
        return cls(server_public, public, secret)

    @classmethod
    def from_environment(cls) -> ClientCurve | None:
        """The keys of the directory named by ``$RADIXCACHE_CURVE_KEYS``, or None when unset."""
        directory = os.environ.get(KEYS_ENV)
        return cls.load(Path(directory)) if directory else None

    def apply(self, sock: zmq.Socket[bytes]) -> None:
        """Set the CURVE client options; call before ``connect``."""
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


def client_curve(curve: ClientCurve | None) -> ClientCurve | None:
    """``curve`` if given, else the keys named by ``$RADIXCACHE_CURVE_KEYS`` (None: plain)."""
    return curve if curve is not None else ClientCurve.from_environment()


class CurveServer:
    """The server half: its keypair and a running ZAP authenticator that accepts only the
    client public keys (``*.key``) in ``directory``. Only one per process at a time (ZAP is
    one handler per context). ``close()`` stops the authenticator."""

    def __init__(self, directory: Path) -> None:
        require_curve()
        files = KeyFiles.in_dir(directory)
        self.directory = directory
        self.keys = ServerKeys(*_load(files.server_secret, secret=True))
        if not files.client_public.exists():
            raise CurveError(f"no client public key {files.client_public}")
        self._auth = _start_authenticator()
        self._auth.configure_curve(domain="*", location=str(directory))

    def close(self) -> None:
        """Stop the authenticator (idempotent). Sockets bound with the keys refuse every
        handshake afterwards."""
        if self._auth.is_alive():
            self._auth.stop()


def _start_authenticator(attempts: int = 100) -> ThreadAuthenticator:
    """A started ZAP authenticator on the process's context. Its handler binds
    ``inproc://zeromq.zap.01``, which a just-stopped authenticator may still hold for a moment
    (ZeroMQ closes sockets asynchronously): retried for up to a second on EADDRINUSE."""
    for attempt in range(attempts):
        auth = ThreadAuthenticator(zmq.Context.instance())
        try:
            auth.start()
            return auth
        except zmq.ZMQError as exc:
            with contextlib.suppress(Exception):
                auth.stop()
            if exc.errno != zmq.EADDRINUSE or attempt == attempts - 1:
                raise
            time.sleep(0.01)
    raise AssertionError("unreachable")
