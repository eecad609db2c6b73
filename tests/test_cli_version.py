from typer.testing import CliRunner

from cli.app import app
from radixcache import __version__


def test_version_prints_the_package_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"radixcache {__version__}\n"
