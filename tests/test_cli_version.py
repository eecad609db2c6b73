import subprocess
import sys

from typer.testing import CliRunner

from cli.app import app
from radixcache import __version__


def test_version_prints_the_package_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"radixcache {__version__}\n"


def test_cli_starts_without_importing_torch() -> None:
    # torch takes seconds to import: `radixcache --help` / `--version` must not wait for it
    code = "import sys, cli.main; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120)
    assert result.stdout == "False\n"


def test_the_cli_answer_modes_are_the_servers() -> None:
    """``--answers`` is typed by a CLI-side enum (the server's imports torch): same values."""
    from cli.options import AnswerMode
    from radixcache.serving.engine import Answers

    assert [m.value for m in AnswerMode] == [a.value for a in Answers] == ["decode", "prefill"]
