"""The layout rules, checked on the source: no import cycle between the project's modules
(``TYPE_CHECKING`` and function-level imports count), imports only down the arrows, and in
``radixcache/``, ``inspector/`` and ``cli/`` every module's size reported (a figure, not a gate: a
module is cut where its concept ends, never to pass a number), failing only far past the
guideline."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("radixcache", "inspector", "cli")


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    """Project modules ``path`` imports anywhere in its body."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        found.update(n for n in names if n in known)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_reports_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_no_import_cycle() -> None:
    known = _modules()
    graph = {name: _imports(path, known) - {name} for name, path in known.items()}
    assert _cycles(graph) == []


def test_tree_and_invariants_do_not_import_each_other() -> None:
    known = _modules()
    assert "radixcache.core.tree" not in _imports(known["radixcache.core.invariants"], known)


# tools/analysis -> serving -> traffic -> wire -> core (traffic reads recordings as traces)
RANK = {"core": 0, "wire": 1, "traffic": 2, "serving": 3, "analysis": 4, "tools": 4}
FORBIDDEN_FOR_INSPECTOR = ("radixcache.core.tree", "radixcache.core.pool",
                           "radixcache.serving.engine")


def _wrong_way(name: str, dep: str) -> bool:
    """True when ``name`` importing ``dep`` runs against the arrows."""
    top, dtop = name.split(".")[0], dep.split(".")[0]
    if top == "radixcache":
        if dtop != "radixcache":
            return True  # the library never imports the inspector or the CLI
        room, droom = name.split(".")[1:2], dep.split(".")[1:2]
        return bool(room and droom) and RANK.get(room[0], 9) < RANK.get(droom[0], 9)
    if top == "inspector":
        return dtop == "cli" or dep in FORBIDDEN_FOR_INSPECTOR
    return False


def test_the_arrows_go_one_way() -> None:
    """cli -> inspector -> radixcache; inside radixcache tools/analysis -> serving -> wire ->
    core; and the inspector never imports the tree, the pool or the engine (it drives a
    service or follows a stream)."""
    known = _modules()
    wrong = [f"{name} -> {dep}" for name, path in known.items()
             for dep in sorted(_imports(path, known)) if _wrong_way(name, dep)]
    assert wrong == []


def test_the_arrow_check_catches_a_wrong_import() -> None:
    assert _wrong_way("radixcache.core.tree", "radixcache.serving.engine")
    assert _wrong_way("radixcache.wire.mirror", "inspector.app")
    assert _wrong_way("inspector.app", "radixcache.core.tree")
    assert not _wrong_way("radixcache.serving.engine", "radixcache.core.tree")
    assert not _wrong_way("cli.main", "radixcache.core.tree")
    assert _wrong_way("radixcache.wire.mirror", "radixcache.traffic.traces")
    assert not _wrong_way("radixcache.traffic.traces", "radixcache.wire.mirror")


def _sources() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


# The guideline is STYLE.md's: a core module reads on two screens (about 400 lines), a function
# fits on one (about 50). The tests print the largest of each so that a reviewer sees them grow;
# they fail only far past the guideline, where no single concept can explain the size.
MODULE_GUIDE, MODULE_LIMIT = 400, 800
FUNCTION_GUIDE, FUNCTION_LIMIT = 50, 100


def _module_sizes() -> dict[str, int]:
    return {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _sources()}


def _function_sizes() -> dict[str, int]:
    sizes: dict[str, int] = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                key = f"{path.relative_to(ROOT)}:{node.lineno}:{node.name}"
                sizes[key] = (node.end_lineno or node.lineno) - node.lineno + 1
    return sizes


def _report(title: str, sizes: dict[str, int], guide: int) -> None:
    top = sorted(sizes.items(), key=lambda kv: -kv[1])[:8]
    over = sum(1 for n in sizes.values() if n > guide)
    print(f"\n{title}: {over} past the guideline of {guide} lines; the largest:")
    for name, n in top:
        print(f"  {n:5d}  {name}")


def test_module_sizes_reported_and_none_far_past_the_guideline() -> None:
    sizes = _module_sizes()
    _report("modules", sizes, MODULE_GUIDE)
    assert {name: n for name, n in sizes.items() if n > MODULE_LIMIT} == {}


def test_function_sizes_reported_and_none_far_past_the_guideline() -> None:
    sizes = _function_sizes()
    _report("functions", sizes, FUNCTION_GUIDE)
    assert {name: n for name, n in sizes.items() if n > FUNCTION_LIMIT} == {}


def test_every_module_names_its_concept() -> None:
    """Each module's docstring says which one concept it holds (package ``__init__`` files,
    which hold none, aside)."""
    missing = [
        str(p.relative_to(ROOT))
        for p in _sources()
        if p.name != "__init__.py" and not ast.get_docstring(ast.parse(p.read_text()))
    ]
    assert missing == []
