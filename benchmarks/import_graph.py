#!/usr/bin/env python3
"""Import circles among jobgen's modules: prints each one, exits 1 if there is any.

    python benchmarks/import_graph.py [--edges] [--all] [--runtime]

The graph is read from the source (ast), nothing is imported. An edge A -> B is any import of B
in A: at the top of the module ("top"), inside a function ("function", run when the function
is first called), or under `if TYPE_CHECKING:` ("typing": never run, but a type that names a
module which imports this one is the same circle in the design). Importing a
submodule runs its packages' __init__ first, so `from ..payloads.base import X` is an edge to
jobgen.payloads as well ("package"). A circle is a strongly connected set of modules; each is
printed with its shortest circles (one per edge inside the set, the first few unless --edges)
and where those edges are.

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


def components(nodes: list[str], graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    result.append(sorted(members))
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
    print(f"{len(known)} modules, {len(where)} imported pairs, "
          f"{len(circles)} import circle{'s' if len(circles) != 1 else ''}")
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
    return 1 if circles else 0


if __name__ == "__main__":
    sys.exit(main())
