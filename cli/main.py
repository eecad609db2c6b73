"""Entry point of the `radixcache` console script: imports every command module."""

from __future__ import annotations

import cli.cmd_bench_tree
import cli.cmd_doctor
import cli.cmd_engine
from cli.app import app


def main() -> None:
    """Run the CLI."""
    app()


if __name__ == "__main__":
    main()
