#!/usr/bin/env python3
"""Import circles among jobgen's modules, and imports that run up the layers: prints each one,
exits 1 if there is any.

    python benchmarks/import_graph.py [--edges] [--all] [--runtime]

The graph is read from the source (ast), nothing is imported. An edge A -> B is any import of B
in A: at the top of the module ("top"), inside a function ("function", run when the function
is first called), or under `if TYPE_CHECKING:` ("typing": never run, but a type that names a
module which imports this one is the same circle in the design). Importing a
submodule runs its packages' __init__ first, so `from ..payloads.base import X` is an edge to
jobgen.payloads as well ("package"). A circle is a strongly connected set of modules; each is
printed with its shortest circles (one per edge inside the set, the first few unless --edges)
and where those edges are.

The layers (LAYERS, bottom up) are the packages of jobgen/: a module imports its own layer and
those below it, never one above ("up"). A module no layer names is reported too (place it).

--edges prints every edge as well; --all includes the command line (jobgen.cli.*), which is left
out by default: it sits on top of the core, and nothing in the core imports it; --runtime leaves
the TYPE_CHECKING-only imports out (only what runs).
"""
from __future__ import annotations

import argparse
import ast
import sys
from collections import deque
from pathlib import Path
from typing import NamedTuple, Optional, Union

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "jobgen"
SHOW = 6             # circles printed per set of modules (all of them with --edges)

# The layers, bottom up. A pattern names a module and the modules under it ("*" stands for one
# part of a name); "=NAME" that module only; "NAME.?" each package directly under NAME (a
# backend's declaration, its __init__.py).
# The most specific pattern wins: the registry and the declarations sit low, the backends'
# implementations high; the Slurm option table is an input the site and the CLI read.
LAYERS = [
    ("plumbing", ["=jobgen", "jobgen.plumbing", "jobgen.data"]),
    ("registry", ["=jobgen.backends", "jobgen.backends.?"]),
    ("inputs", ["jobgen.inputs", "jobgen.backends.slurm.options"]),
    ("images", ["jobgen.images"]),
    ("job", ["jobgen.job"]),
    ("payloads", ["jobgen.payloads"]),
    ("runs", ["jobgen.runs"]),
    ("watching", ["jobgen.watching"]),
    ("api", ["jobgen.api"]),
    ("planning", ["jobgen.planning"]),
    ("reporting", ["jobgen.reporting"]),
    ("backends", ["jobgen.backends"]),
    ("check", ["jobgen.check"]),
    ("cli", ["jobgen.cli", "jobgen.backends.*.cli"]),     # a backend's own commands too
]


class Edge(NamedTuple):
    source: str
    target: str
    kind: str        # top | function | package
    line: int


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_package(name: str, known: dict[str, Path]) -> bool:
    return known[name].name == "__init__.py"


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


Statement = Union[ast.Import, ast.ImportFrom]


def _imports(tree: ast.Module, typing: bool) -> list[tuple[Statement, str]]:
    """(import statement, top|function|typing); the TYPE_CHECKING-only ones only if `typing`."""
    out: list[tuple[Statement, str]] = []

    def visit(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child.test):
                if typing:
                    for stmt in child.body:
                        visit_stmt(stmt, "typing")
                for stmt in child.orelse:
                    visit_stmt(stmt, kind)
                continue
            visit_stmt(child, kind)

    def visit_stmt(node: ast.AST, kind: str) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append((node, kind))
            return
        inner = "function" if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                  ast.Lambda)) else kind
        visit(node, inner)

    visit(tree, "top")
    return out


def _resolve(importer: str, node: ast.ImportFrom, known: dict[str, Path]) -> Optional[str]:
    """The module a `from X import ...` names, absolute."""
    if node.level == 0:
        return node.module
    base = importer.split(".")
    if not _is_package(importer, known):
        base = base[:-1]
    if node.level > 1:
        base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def edges(known: dict[str, Path], typing: bool = False) -> list[Edge]:
    found: set[Edge] = set()
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, kind in _imports(tree, typing):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _resolve(name, node, known)
                if base is None:
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in known else base)
            for target in targets:
                # `import jobgen.a.b` names jobgen.a.b; keep the longest known prefix.
                parts = target.split(".")
                while parts and ".".join(parts) not in known:
                    parts.pop()
                if not parts or parts[0] != PACKAGE:
                    continue
                target = ".".join(parts)
                if target != name:
                    found.add(Edge(name, target, kind, node.lineno))
                # The packages around the target run first, unless they hold the importer.
                for i in range(2, len(parts)):
                    package = ".".join(parts[:i])
                    if not (name == package or name.startswith(package + ".")):
                        found.add(Edge(name, package, "package", node.lineno))
    return sorted(found)


def layer(module: str, known: dict[str, Path]) -> Optional[int]:
    """The index in LAYERS of a module's layer (the most specific pattern), None if unplaced."""
    best: Optional[tuple[int, int]] = None
    for rank, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            if pattern.startswith("="):
                hit, weight = module == pattern[1:], 1000
            elif pattern.endswith(".?"):
                base = pattern[:-2]
                hit = (module.startswith(base + ".") and module.count(".") == base.count(".") + 1
                       and _is_package(module, known))
                weight = len(pattern)
            else:
                parts, have = pattern.split("."), module.split(".")
                hit = len(have) >= len(parts) and all(
                    p in ("*", h) for p, h in zip(parts, have))
                weight = len(pattern)
            if hit and (best is None or weight > best[0]):
                best = (weight, rank)
    return None if best is None else best[1]


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """The modules `start` imports, directly or through others."""
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node] - seen)
    return seen


def components(nodes: list[str], graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected sets of more than one module: each module with those it reaches and
    that reach it back (the graph is a few hundred edges: one walk per module is enough)."""
    reach = {node: _reach(graph, node) for node in nodes}
    result, placed = [], set()
    for node in nodes:
        if node in placed:
            continue
        members = sorted({node} | {m for m in reach[node] if node in reach[m]})
        placed.update(members)
        if len(members) > 1:
            result.append(members)
    return sorted(result)


def shortest_path(graph: dict[str, set[str]], start: str, goal: str,
                  within: set[str]) -> Optional[list[str]]:
    before: dict[str, Optional[str]] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            path = [node]
            while before[path[-1]] is not None:
                path.append(before[path[-1]])  # type: ignore[arg-type]
            return path[::-1]
        for child in sorted(graph[node] & within):
            if child not in before:
                before[child] = node
                queue.append(child)
    return None


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", action="store_true", help="print every edge too")
    parser.add_argument("--all", action="store_true", help="include jobgen.cli")
    parser.add_argument("--runtime", action="store_true",
                        help="leave out the imports under `if TYPE_CHECKING:`")
    args = parser.parse_args(argv)
    known = modules(ROOT)
    found = edges(known, not args.runtime)
    if not args.all:
        def core(module: str) -> bool:
            return not (module == f"{PACKAGE}.cli" or module.startswith(f"{PACKAGE}.cli."))
        known = {k: v for k, v in known.items() if core(k)}
        found = [e for e in found if core(e.source) and core(e.target)]
    graph: dict[str, set[str]] = {name: set() for name in known}
    where: dict[tuple[str, str], list[Edge]] = {}
    for edge in found:
        graph[edge.source].add(edge.target)
        where.setdefault((edge.source, edge.target), []).append(edge)
    if args.edges:
        for edge in sorted(found):
            print(f"{edge.source} -> {edge.target}  ({edge.kind}, line {edge.line})")
    circles = components(sorted(known), graph)
    verbose = args.edges
    ranks = {name: layer(name, known) for name in known}
    unplaced = sorted(name for name, rank in ranks.items() if rank is None)
    up = []
    for edge in found:
        low, high = ranks[edge.source], ranks[edge.target]
        if low is not None and high is not None and high > low:
            up.append((edge, LAYERS[low][0], LAYERS[high][0]))
    print(f"{len(known)} modules, {len(where)} imported pairs, "
          f"{len(circles)} import circle{'s' if len(circles) != 1 else ''}, "
          f"{len(up)} up the layers")
    for edge, below, above in up:
        path = known[edge.source].relative_to(ROOT)
        print(f"  up: {path}:{edge.line}: {edge.source} ({below}) imports {edge.target} "
              f"({above}, {edge.kind})")
    for name in unplaced:
        print(f"  in no layer: {name} (add it to LAYERS)")
    for number, members in enumerate(circles, 1):
        within = set(members)
        print(f"\ncircle {number}: {', '.join(members)}")
        seen: set[tuple[str, ...]] = set()
        shown = 0
        for source in members:
            for target in sorted(graph[source] & within):
                back = shortest_path(graph, target, source, within)
                if back is None:
                    continue
                cycle = [source, *back[:-1]]
                turn = cycle.index(min(cycle))
                key = tuple(cycle[turn:] + cycle[:turn])
                if key in seen:
                    continue
                seen.add(key)
                shown += 1
                if shown > SHOW and not verbose:
                    continue
                print("  " + " -> ".join([*key, key[0]]))
                for a, b in zip(key, [*key[1:], key[0]]):
                    for edge in where[(a, b)]:
                        path = known[a].relative_to(ROOT)
                        print(f"      {path}:{edge.line}: imports {b} ({edge.kind})")
        if shown > SHOW and not verbose:
            print(f"  ... and {shown - SHOW} more through the same modules (--edges shows all)")
    return 1 if circles or up or unplaced else 0


if __name__ == "__main__":
    sys.exit(main())
