"""The radixcache command line (Typer)."""
