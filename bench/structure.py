"""Code structure figures to compare before and after a refactor, read statically from the source (nothing is imported).

Per top-level package and for the product as a whole: modules and lines; the import graph within each package
(arrows, arrows back up = edges inside an import cycle, floors = longest path of the condensation, its chain) and the
arrows between packages (flagging web <-> worker and tasks -> anything); the longest modules and functions;
`# type: ignore` comments and those with no `# reason` after them; blocks of 6+ significant lines (not blank, a comment,
a docstring nor an import) repeated elsewhere; class names defined more than once. Nested functions count as functions.

    .venv/bin/python -m bench.structure [--json] [PACKAGE ...]      # from the repository root; default: tasks web worker cli

Its imports are the standard library only.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import tokenize
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_PACKAGES = ["tasks", "web", "worker", "cli"]
SKIP_PARTS = {"tests", ".venv", "__pycache__"}
WINDOW = 6
IGNORE = re.compile(r"#\s*type:\s*ignore(\[[^\]]*\])?(?P<rest>.*)")
Graph = dict[str, set[str]]


@dataclass
class Module:
    name: str  # dotted; a package's __init__ is the package's own name
    path: str
    is_package: bool
    source: str
    tree: ast.Module
    imports: list[tuple[str, str]] = field(default_factory=list)  # (resolved target, "top" | "function" | "typing")

    @property
    def package(self) -> str:
        return self.name.split(".")[0]

    @property
    def lines(self) -> int:
        return len(self.source.splitlines())


def load(root: Path, packages: list[str]) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if SKIP_PARTS & set(rel.parts):
                continue
            parts = list(rel.with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            source = path.read_text(encoding="utf-8")
            modules[name] = Module(name, str(rel), is_package, source, ast.parse(source, str(rel)))
    for module in modules.values():
        module.imports = find_imports(module, set(modules))
    return modules


def resolve(dotted: str, known: set[str]) -> str:
    """The longest prefix of `dotted` that is a known module (the name itself if none is: a package not read)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return dotted


def import_targets(node: ast.Import | ast.ImportFrom, module: Module, known: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [resolve(alias.name, known) for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    return [resolve(f"{base}.{alias.name}" if alias.name != "*" else base, known) for alias in node.names]


def find_imports(module: Module, known: set[str]) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.extend((target, kind) for target in import_targets(child, module, known))
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, "function")
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test) and kind == "top":
                visit(ast.Module(body=child.body, type_ignores=[]), "typing")
                visit(ast.Module(body=child.orelse, type_ignores=[]), kind)
            else:
                visit(child, kind)

    visit(module.tree, "top")
    return found


def strongly_connected(graph: Graph) -> list[list[str]]:
    """Tarjan's algorithm, iteratively; a component comes out after every component it reaches."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        index[start] = low[start] = len(index)
        stack.append(start)
        work = [(start, iter(sorted(graph[start])))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    components.append(sorted(stack[stack.index(node) :]))
                    del stack[stack.index(node) :]
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in stack:
                low[node] = min(low[node], index[child])
    return components


def longest_chain(graph: Graph, components: list[list[str]]) -> list[list[str]]:
    """One longest path through the condensation DAG, as the components (lists of modules) along it."""
    owner = {node: i for i, component in enumerate(components) for node in component}
    below: dict[int, set[int]] = {i: set() for i in range(len(components))}
    for node, targets in graph.items():
        below[owner[node]].update(owner[t] for t in targets if owner[t] != owner[node])
    best: dict[int, list[int]] = {}
    for i in range(len(components)):  # Tarjan emits a component after every component it reaches
        tails = [best[j] for j in below[i]]
        best[i] = [i] + max(tails, key=len, default=[])
    path = max(best.values(), key=len, default=[])
    return [components[i] for i in path]


def package_graph(modules: dict[str, Module], package: str) -> dict[str, Any]:
    names = [name for name, m in modules.items() if m.package == package]
    imports = [(name, target, kind) for name in names for target, kind in modules[name].imports]
    imports = [(name, target, kind) for name, target, kind in imports if target in names and target != name]
    kinds: dict[tuple[str, str], set[str]] = defaultdict(set)
    for name, target, kind in imports:
        kinds[name, target].add(kind)
    graph: Graph = {name: {b for a, b in kinds if a == name} for name in names}
    components = strongly_connected(graph)
    cyclic = {node: i for i, c in enumerate(components) if len(c) > 1 for node in c}
    back = sorted(
        f"{a} -> {b}" for a, targets in graph.items() for b in targets if a in cyclic and cyclic[a] == cyclic.get(b)
    )
    chain = longest_chain(graph, components)
    return {
        "modules": len(names),
        "arrows": len(kinds),
        "arrows_only_in_functions": sum(k == {"function"} for k in kinds.values()),
        "arrows_only_type_checking": sum(k == {"typing"} for k in kinds.values()),
        "imported_names": len(imports),
        "imported_names_in_functions": sum(kind == "function" for _, _, kind in imports),
        "cycles": [c for c in components if len(c) > 1],
        "arrows_back_up": back,
        "floors": len(chain),
        "longest_chain": [c[0] if len(c) == 1 else "{" + ", ".join(c) + "}" for c in chain],
    }


def cross_package(modules: dict[str, Module], packages: list[str]) -> dict[str, Any]:
    pairs = {(m.name, t) for m in modules.values() for t, _ in m.imports if t.split(".")[0] in packages}
    counts = Counter(f"{a.split('.')[0]} -> {b.split('.')[0]}" for a, b in pairs if a.split(".")[0] != b.split(".")[0])
    wrong = [arrow for arrow in counts if arrow.startswith("tasks ->") or arrow in ("web -> worker", "worker -> web")]
    return {"arrows": dict(sorted(counts.items())), "wrong_way": sorted(wrong)}


def functions(modules: dict[str, Module]) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, path: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                if not isinstance(child, ast.ClassDef):
                    found.append(
                        (f"{path}:{prefix}{child.name}", (child.end_lineno or child.lineno) - child.lineno + 1)
                    )
                visit(child, path, f"{prefix}{child.name}.")
            else:
                visit(child, path, prefix)

    for module in modules.values():
        visit(module.tree, module.path, "")
    return sorted(found, key=lambda f: (-f[1], f[0]))


def type_ignores(module: Module) -> tuple[int, int]:
    """`# type: ignore` comments in the module, and how many of them give no `# reason` after."""
    total = bare = 0
    for token in tokenize.generate_tokens(io.StringIO(module.source).readline):
        match = IGNORE.search(token.string) if token.type == tokenize.COMMENT else None
        if match:
            total += 1
            bare += not re.search(r"#\s*\S", match["rest"])
    return total, bare


def significant_lines(module: Module) -> list[tuple[int, str]]:
    """(line number, stripped text) of the lines that are not blank, comments alone, docstrings nor imports."""
    skip: set[int] = set()
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import | ast.ImportFrom) or (
            isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        ):
            skip.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    lines = enumerate(module.source.splitlines(), 1)
    return [(n, s.strip()) for n, s in lines if s.strip() and not s.strip().startswith("#") and n not in skip]


def repeated_blocks(modules: dict[str, Module]) -> dict[str, Any]:
    sig = {m.path: significant_lines(m) for m in modules.values()}
    places: dict[tuple[str, ...], list[tuple[str, int]]] = defaultdict(list)
    for path, lines in sig.items():
        for i in range(len(lines) - WINDOW + 1):
            places[tuple(text for _, text in lines[i : i + WINDOW])].append((path, i))
    pairs: set[tuple[str, int, str, int]] = set()
    repeated = 0
    for occurrences in places.values():
        found = {
            (a[0], a[1], b[0], b[1])
            for k, a in enumerate(occurrences)
            for b in occurrences[k + 1 :]
            if a[0] != b[0] or b[1] - a[1] >= WINDOW
        }
        repeated += bool(found)
        pairs |= found
    blocks: list[tuple[int, str]] = []
    for a, i, b, j in pairs:
        if (a, i - 1, b, j - 1) in pairs:
            continue  # not the start of a block
        k = 0
        while (a, i + k + 1, b, j + k + 1) in pairs:
            k += 1
        last = k + WINDOW - 1
        span = f"{a}:{sig[a][i][0]}-{sig[a][i + last][0]} == {b}:{sig[b][j][0]}-{sig[b][j + last][0]}"
        blocks.append((last + 1, span))
    blocks.sort(key=lambda block: (-block[0], block[1]))
    return {
        "repeated_windows": repeated,
        "blocks": len(blocks),
        "top": [f"{span} ({n} lines)" for n, span in blocks[:10]],
    }


def duplicate_classes(modules: dict[str, Module]) -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for module in modules.values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{module.path}:{node.lineno}")
    return {name: sorted(paths) for name, paths in sorted(where.items()) if len(paths) > 1}


def sizes(modules: list[Module], funcs: list[tuple[str, int]]) -> dict[str, Any]:
    ignores = [(m.path, *type_ignores(m)) for m in modules]
    return {
        "modules": len(modules),
        "lines": sum(m.lines for m in modules),
        "modules_over_300_lines": sum(m.lines > 300 for m in modules),
        "functions": len(funcs),
        "functions_over_50_lines": sum(n > 50 for _, n in funcs),
        "type_ignores": sum(t for _, t, _ in ignores),
        "type_ignores_without_reason": sum(b for _, _, b in ignores),
        "type_ignores_by_file": {p: f"{t} ({b} without reason)" for p, t, b in ignores if t},
    }


def measure(root: Path, packages: list[str]) -> dict[str, Any]:
    modules = load(root, packages)
    funcs = functions(modules)
    per_package: dict[str, Any] = {}
    for package in packages:
        members = [m for m in modules.values() if m.package == package]
        own = [f for f in funcs if f[0].split("/")[0] == package]
        per_package[package] = sizes(members, own) | {"imports": package_graph(modules, package)}
    return {
        "product": sizes(list(modules.values()), funcs),
        "packages": per_package,
        "between_packages": cross_package(modules, packages),
        "longest_modules": [f"{m.path} ({m.lines})" for m in sorted(modules.values(), key=lambda m: -m.lines)[:10]],
        "longest_functions": [f"{name} ({n})" for name, n in funcs[:15]],
        "repeated_code": repeated_blocks(modules),
        "classes_defined_more_than_once": duplicate_classes(modules),
    }


def print_text(figures: dict[str, Any], indent: str = "") -> None:
    for key, value in figures.items():
        label = key if "/" in key else key.replace("_", " ")
        if isinstance(value, dict | list) and not value:
            print(f"{indent}{label}: -")
        elif isinstance(value, dict):
            print(f"{indent}{label}:")
            print_text(value, indent + "  ")
        elif key == "longest_chain":
            print(f"{indent}{label}: {' -> '.join(value)}")
        elif isinstance(value, list) and any(isinstance(v, list) or len(v) > 30 for v in value):
            print(f"{indent}{label}:")
            for item in value:
                print(f"{indent}  {', '.join(item) if isinstance(item, list) else item}")
        elif isinstance(value, list):
            print(f"{indent}{label}: {', '.join(value)}")
        else:
            print(f"{indent}{label}: {value}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    parser.add_argument("packages", nargs="*", default=DEFAULT_PACKAGES)
    args = parser.parse_args()
    figures = measure(Path.cwd(), args.packages)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print_text(figures)


if __name__ == "__main__":
    main()
