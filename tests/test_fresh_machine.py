"""A new user's first minute: install the package from a clean copy of this working tree into
a new virtual environment (not editable) and run its `radixcache` script from elsewhere.

The copy holds the files git tracks plus the untracked files git does not ignore, so the test
sees what the next commit will hold. The venv uses ``--system-site-packages`` for the heavy
dependencies (torch, textual, ...); ``pip install --no-deps --no-build-isolation`` builds and
installs only radixcache itself.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from radixcache import __version__
from radixcache.wire.recording import RecordingReader

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120


def _tracked_and_untracked(repo: Path) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=repo, capture_output=True, check=True,
    ).stdout.decode()
    return [name for name in out.split("\0") if name and (repo / name).is_file()]


def _copy_tree(repo: Path, dest: Path) -> None:
    for name in _tracked_and_untracked(repo):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, target)


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RADIXCACHE_DEBUG")}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)


def _see_this_environment(env: Path) -> None:
    """Let the new venv see the packages of the environment running the tests. From the base
    interpreter ``--system-site-packages`` does that; from inside a venv it reaches the base
    interpreter instead (whose setuptools may be old, with no ``wheel``), so the running
    environment's site directories are appended with a .pth file (after the venv's own, so
    the copy installed there still wins)."""
    if sys.prefix == sys.base_prefix:
        return
    (site_dir,) = (env / "lib").glob("python3*/site-packages")
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    (site_dir / "_running_environment.pth").write_text("\n".join(dirs) + "\n")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with radixcache installed from a clean copy of the working tree."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs the git working tree to copy from")
    root = tmp_path_factory.mktemp("fresh")
    src, env = root / "src", root / "venv"
    _copy_tree(REPO, src)
    assert not (src / ".git").exists()
    made = _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                 str(env)], root)
    assert made.returncode == 0, made.stderr
    _see_this_environment(env)
    # the venv reaches the machine's pip through --system-site-packages; it installs into the venv
    pip = _run([str(env / "bin" / "python"), "-m", "pip", "install", "--no-deps",
                "--no-build-isolation", "--no-input", "--disable-pip-version-check", "-q",
                str(src)], root)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return env


def test_the_venv_runs_the_installed_copy(venv: Path, tmp_path: Path) -> None:
    code = ("import cli, inspector, radixcache; "
            "print(cli.__file__); print(inspector.__file__); print(radixcache.__file__)")
    result = _run([str(venv / "bin" / "python"), "-c", code], tmp_path)
    assert result.returncode == 0, result.stderr
    site = str(venv / "lib")
    files = result.stdout.split()
    assert len(files) == 3
    for name in files:
        assert name.startswith(site), name
        assert "site-packages" in name, name
    (script,) = [line for line in (venv / "bin" / "radixcache").read_text().splitlines()
                 if line.startswith("#!")]
    assert script == f"#!{venv / 'bin' / 'python'}"


def test_version_doctor_record_and_tree(venv: Path, tmp_path: Path) -> None:
    radixcache = str(venv / "bin" / "radixcache")
    version = _run([radixcache, "--version"], tmp_path)
    assert (version.returncode, version.stdout, version.stderr) == (
        0, f"radixcache {__version__}\n", "")

    doctor = _run([radixcache, "doctor"], tmp_path)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr

    rcx = tmp_path / "chat.rcx"
    record = _run([radixcache, "record", "--workload", "chat", "--requests", "20",
                   "--out", str(rcx)], tmp_path)
    assert record.returncode == 0, record.stdout + record.stderr
    assert record.stdout.startswith("wrote ")
    assert rcx.is_file()

    tree = _run([radixcache, "tree", str(rcx)], tmp_path)
    assert tree.returncode == 0, tree.stdout + tree.stderr
    mirror, _ = RecordingReader(rcx).mirror_at(2**62)
    assert tree.stdout.splitlines()[0] == f"root ({len(mirror.nodes) - 1} nodes)"
