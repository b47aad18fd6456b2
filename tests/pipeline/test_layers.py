"""The package's floors hold: no import cycle between its subpackages, counting every import (those
inside functions too), and every subpackage has a place in the layers contract of pyproject.toml
(which ``lint-imports`` checks in ``make test``)."""

import ast
import os
import pkgutil
import sys
from collections import defaultdict
from typing import Dict, List, Set

import opendit_lite

PACKAGE_DIR = os.path.dirname(os.path.abspath(opendit_lite.__file__))
ROOT = os.path.dirname(PACKAGE_DIR)


def _units() -> Set[str]:
    """The top-level subpackages and modules of opendit_lite (``models``, ``errors``, ...)."""
    return {m.name for m in pkgutil.iter_modules([PACKAGE_DIR])}


def _imported_modules(path: str, module: str, is_package: bool) -> List[str]:
    """Absolute names of everything ``path`` imports, at any depth of its code."""
    package = module if is_package else module.rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            names.append(target)
            names += [f"{target}.{alias.name}" for alias in node.names]  # `from pkg import submodule`
    return names


def subpackage_graph() -> Dict[str, Set[str]]:
    """unit -> the other units of opendit_lite it imports."""
    units, edges = _units(), defaultdict(set)
    for dirpath, _, files in os.walk(PACKAGE_DIR):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
            is_package = rel.endswith(".__init__")
            module = rel[: -len(".__init__")] if is_package else rel
            parts = module.split(".")
            if len(parts) < 2:
                continue  # the package's own __init__ only names the entry points (lazily)
            for target in _imported_modules(path, module, is_package):
                tparts = target.split(".")
                if tparts[0] == "opendit_lite" and len(tparts) > 1 and tparts[1] in units and tparts[1] != parts[1]:
                    edges[parts[1]].add(tparts[1])
    return edges


def find_cycle(edges: Dict[str, Set[str]]) -> List[str]:
    """One import cycle as [a, b, ..., a], or [] when the graph is acyclic."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    path: List[str] = []

    def visit(node: str) -> List[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_find_cycle_reports_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) == []


def test_subpackages_import_without_cycles():
    edges = subpackage_graph()
    assert edges["training"] and edges["models"]  # the graph was read
    cycle = find_cycle(edges)
    assert not cycle, "import cycle between subpackages: " + " -> ".join(cycle)


def test_every_subpackage_has_a_floor():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["type"] == "layers")["layers"]
    placed = {name.strip() for layer in layers for name in layer.replace(":", "|").split("|")}
    assert placed == _units(), f"not in the layers contract: {sorted(_units() - placed)}; " \
                               f"listed but absent: {sorted(placed - _units())}"
