"""The Typer application objects that every command module registers on."""

from __future__ import annotations

import typer

from radixcache import __version__

app = typer.Typer(
    name="radixcache",
    help="A token-granular radix-tree KV cache engine and its live terminal inspector.",
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode="rich",
    no_args_is_help=True,
)
bench_app = typer.Typer(
    help="Benchmarks: each prints a table, or one JSON object with --json.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"radixcache {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """radixcache: see and steer a radix KV cache."""
