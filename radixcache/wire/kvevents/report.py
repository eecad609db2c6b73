"""What ``radixcache tree --kv-events`` prints, and the counters the inspector's screen shows."""

from __future__ import annotations

from radixcache.core.tokens import TokenText
from radixcache.wire.kvevents.pubsub import KVEventsClient
from radixcache.wire.kvevents.radix import tree_lines


def counter_lines(client: KVEventsClient) -> list[tuple[str, str]]:
    """(name, value) pairs: blocks per tier, rates, churn, the stream's counters."""
    view, merge, stats = client.view, client.merger.stats, client.stats
    rates = view.rates()
    churn = view.stats.churned / view.stats.removed if view.stats.removed else 0.0
    out = [("history", client.health().sync.value), ("live blocks", f"{len(view.blocks):,}")]
    out += [(f"  {medium}", f"{n:,}") for medium, n in sorted(view.tiers.items())]
    out += [("stored/s", f"{rates.stored_per_s:,.1f}"),
            ("removed/s", f"{rates.removed_per_s:,.1f}"), ("churn", f"{churn:.1%}"),
            ("batches", f"{stats.batches:,}"),
            ("stored", f"{view.stats.stored:,}"), ("removed", f"{view.stats.removed:,}"),
            ("cleared", f"{view.stats.cleared:,}"), ("replayed", f"{merge.replayed:,}"),
            ("gaps", f"{merge.gaps:,}"), ("lost batches", f"{merge.lost:,}"),
            ("restarts", f"{merge.restarts:,}"),
            ("unknown removed", f"{view.stats.unknown_removed:,}"),
            ("conflicts", f"{view.stats.conflicts:,}"), ("malformed", f"{stats.malformed:,}")]
    return out


def status_lines(client: KVEventsClient) -> list[str]:
    """Format, history and error lines (what a user must see before trusting the counts)."""
    fmt = client.fmt.label() if client.fmt is not None else "no batch yet"
    lines = [f"format: {fmt}", f"history: {client.health().line()}"]
    if client.stats.last_error:
        stats = client.stats
        lines.append(f"last error: {stats.last_error} ({stats.malformed:,} malformed)")
    return lines


def follow_lines(client: KVEventsClient, seconds: float, limit: int,
                 text: TokenText | None = None) -> list[str]:
    """Follow for ``seconds``, then the radix tree (at most ``limit`` nodes), the status lines,
    the tiers, and last ``live blocks: N``."""
    client.run_for(seconds)
    lines = ["blocks", *tree_lines(client.view, limit, text), *status_lines(client)]
    tiers = ", ".join(f"{m} {n:,}" for m, n in sorted(client.view.tiers.items()))
    if tiers:
        lines.append(f"tiers: {tiers}")
    lines.append(f"live blocks: {len(client.view.blocks)}")
    return lines
