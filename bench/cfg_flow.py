"""How a cell's config travels through the code, read from the source: every call that hands on the config
(`cfg`, `cfg.<section>...` or `self.cfg...` as an argument) is an edge from the calling function's module to
the module the callee is imported from. An edge *stays* when the callee's module sits at the caller's
layer or below, and *climbs back up* when it sits above: reached through an import inside a function, the
dependency the module's top does not show. A module's layer is 0 when it imports no project module at its
top, else one more than the highest layer it imports there. A module is *entered* once per distinct
(calling function, callee) edge into it from another module.

    .venv/bin/python bench/cfg_flow.py                 # the working tree
    .venv/bin/python bench/cfg_flow.py --root <dir>    # another checkout (an older commit, to compare)
"""
from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

PACKAGES = ("harness", "grid", "analysis", "reports")
Edge = Tuple[str, str, str, str]  # caller module, caller function, callee module, callee name


def sources(root: Path) -> Dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(statement: ast.stmt, modules: Set[str]) -> Dict[str, str]:
    """Local name -> the project module it comes from, for one import statement."""
    names: Dict[str, str] = {}
    if isinstance(statement, ast.Import):
        for alias in statement.names:
            if alias.name in modules:
                top = alias.name.split(".")[0]
                names[alias.asname or top] = alias.name if alias.asname else top
    elif isinstance(statement, ast.ImportFrom) and statement.module and statement.level == 0:
        for alias in statement.names:
            full = f"{statement.module}.{alias.name}"
            if full in modules:
                names[alias.asname or alias.name] = full
            elif statement.module in modules:
                names[alias.asname or alias.name] = statement.module
    return names


def layers(modules: Dict[str, ast.Module]) -> Dict[str, int]:
    below = {m: {t for s in tree.body for t in imported(s, set(modules)).values() if t != m}
             for m, tree in modules.items()}
    memo: Dict[str, int] = {}

    def layer(module: str, path: Tuple[str, ...]) -> int:
        if module not in memo:
            lower = [layer(m, path + (module,)) for m in below[module] if m not in path]
            memo[module] = 1 + max(lower) if lower else 0
        return memo[module]

    for module in modules:
        layer(module, ())
    return memo


def carries_config(node: ast.expr) -> bool:
    """`cfg`, `cfg.x.y` or `self.cfg.x`: the config or one of its sections."""
    while isinstance(node, ast.Attribute):
        if node.attr == "cfg" and isinstance(node.value, ast.Name) and node.value.id == "self":
            return True
        node = node.value
    return isinstance(node, ast.Name) and node.id == "cfg"


def functions(tree: ast.AST, prefix: str = "") -> Iterator[Tuple[str, ast.AST]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")


def own_nodes(function: ast.AST) -> Iterator[ast.AST]:
    """The function's body without the bodies of the functions and classes defined in it."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def callee_module(call: ast.Call, names: Dict[str, str], module: str, local: Set[str]) -> Optional[Tuple[str, str]]:
    func = call.func
    if isinstance(func, ast.Name):
        if func.id in names:
            return names[func.id], func.id
        return (module, func.id) if func.id in local else None
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        if func.value.id in names:
            return names[func.value.id], func.attr
        if func.value.id in ("self", "cls"):
            return module, func.attr
    return None


def edges(root: Path) -> Tuple[List[Edge], Dict[str, int]]:
    paths = sources(root)
    trees = {m: ast.parse(p.read_text()) for m, p in paths.items()}
    modules = set(trees)
    found: Set[Edge] = set()
    for module, tree in trees.items():
        top: Dict[str, str] = {}
        for statement in tree.body:
            top.update(imported(statement, modules))
        local = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        for name, function in functions(tree):
            names = dict(top)
            for node in own_nodes(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names.update(imported(node, modules))
            for node in own_nodes(function):
                if isinstance(node, ast.Call) and any(carries_config(a) for a in
                                                      [*node.args, *(k.value for k in node.keywords)]):
                    target = callee_module(node, names, module, local)
                    if target is not None:
                        found.add((module, name, *target))
    return sorted(found), layers(trees)


def reachable(found: List[Edge], start: Tuple[str, str]) -> List[Edge]:
    """The edges met following the config from `start` (module, function): a callee name is followed into
    its module's function of that name, or its class's methods (a constructor hands the config to them)."""
    by_caller: Dict[Tuple[str, str], List[Edge]] = {}
    for edge in found:
        by_caller.setdefault((edge[0], edge[1]), []).append(edge)
    seen, stack, kept = {start}, [start], []
    while stack:
        for edge in by_caller.get(stack.pop(), []):
            kept.append(edge)
            for caller in by_caller:
                here = caller[0] == edge[2] and (caller[1] == edge[3] or caller[1].startswith(edge[3] + "."))
                if here and caller not in seen:
                    seen.add(caller)
                    stack.append(caller)
    return sorted(set(kept))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parent.parent), help="a checkout of the repo")
    parser.add_argument("--from", dest="start", default="harness.run:run_cell",
                        help="module:function to follow the config from (all: every call in the tree)")
    args = parser.parse_args()
    found, level = edges(Path(args.root))
    if args.start != "all":
        found = reachable(found, tuple(args.start.split(":")))
    climbs = [e for e in found if level.get(e[2], 0) > level.get(e[0], 0)]
    entered = Counter(e[2] for e in found if e[0] != e[2])
    print(f"{len(found)} calls hand on the config: {len(found) - len(climbs)} stay, {len(climbs)} climb back up")
    for caller, function, callee, name in climbs:
        print(f"  up: {caller}.{function} (layer {level[caller]}) -> {callee}.{name} (layer {level[callee]})")
    print("entered most: " + ", ".join(f"{m} {n}" for m, n in entered.most_common(8)))


if __name__ == "__main__":
    main()
