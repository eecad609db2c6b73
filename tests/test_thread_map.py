"""docs/architecture.md's thread map names every thread the three packages start, and says for
each whether a Guard runs it or why not."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a thread's name where it is started: Thread(..., name="x"), guard.start("x", ...) or a
# pool's ThreadPoolExecutor(..., thread_name_prefix="x")
STARTS = re.compile(r'Thread\([^)]*?name=f?"([\w-]+?)(?:-\{\w+\})?"'
                    r'|guard\.start\(f?"([\w-]+?)(?:-\{\w+\})?"'
                    r'|thread_name_prefix="([\w-]+)"', re.DOTALL)


def _started() -> set[str]:
    names: set[str] = set()
    for package in ("radixcache", "inspector", "cli"):
        for path in (ROOT / package).rglob("*.py"):
            for m in STARTS.finditer(path.read_text()):
                names.add(m.group(1) or m.group(2) or m.group(3))
    return names


def _map() -> dict[str, str]:
    """thread name -> its 'if it dies' column."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc[doc.index("## Threads and locks"):doc.index("Lock order")]
    out = {}
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        name = re.match(r"`([\w-]+?)(?:-N)?`", cells[0]) if len(cells) == 5 else None
        if name:
            out[name.group(1)] = cells[4]
    return out


def test_every_started_thread_is_in_the_map_guarded_or_with_the_reason() -> None:
    started, rows = _started(), _map()
    assert started == {"rc-service-loop", "rc-publisher", "rc-kvevents", "rc-http",
                       "rc-embedded-feed", "rc-subscriber", "rc-replay", "rc-kv-fleet",
                       "kv-events", "rc-router-poll", "dataset-words", "rc-demo-mix",
                       "bench-source", "soak", "rc-supervisor", "rc-lossy-hop",
                       "rc-demo-start", "busy-peer", "rc-http-encode", "rc-trace-scan",
                       "rc-trace-read", "rc-router-front", "rc-fault-client", "rc-engine-facts",
                       "rc-engine-port", "rc-engine-ask", "rc-front-wire",
                       "rc-whatif-sample"}
    assert started <= set(rows)
    for name in started:
        said = rows[name]
        assert said.startswith("Guard") or said.startswith("not "), (name, said)
