"""The package's shape, read from its source with `ast` (nothing of it is imported): no import
cycles among its modules, imports only down its layers (`LAYERS`), no Ray in the parts that
must run without it (`NO_RAY`), no module over 400 lines, and no function over 80 lines (the
training loop's `train` among them).

An import is any `import` or `from ... import` anywhere in a module: at its top, inside a
function, under `if TYPE_CHECKING:`. `from schedule_search.a import b` imports the module
`schedule_search.a.b` where there is one, else `schedule_search.a`."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "schedule_search"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
#: The package's parts, bottom-up: each may import itself and the parts before it, never one
#: after it. A part is a subpackage or a top-level module; the package's own `__init__` sits
#: under them all (it holds the version and imports nothing of the package).
LAYERS = (
    "core",
    "tasks",
    "train",
    "store",
    "forecast",
    "recipe",
    "integrations",
    "sweep",
    "transfer",
    "report",
    "commands",
    "cli",
)
#: The parts that import no `ray` module at all, not even inside a function.
NO_RAY = ("core", "store", "forecast", "recipe", "integrations", "report")


@dataclass(frozen=True)
class Module:
    name: str  # dotted: schedule_search.sweep.driver
    file: str  # schedule_search/sweep/driver.py
    tree: ast.Module
    lines: int

    @property
    def package(self) -> str:
        """The package its relative imports start from."""
        return self.name if self.file.endswith("__init__.py") else self.name.rpartition(".")[0]


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int


def read_modules(package: Path) -> dict[str, Module]:
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        file = path.relative_to(package.parent).as_posix()
        text = path.read_text()
        modules[name] = Module(name, file, ast.parse(text, file), len(text.splitlines()))
    return modules


def imports_of(module: Module, modules: dict[str, Module]) -> list[Import]:
    """The package's own modules `module` imports, each with the line that imports it."""
    root = next(iter(modules)).split(".")[0]

    def known(name: str) -> str | None:
        """`name`, or the nearest package above it that is one of the modules."""
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    found = []
    for node in ast.walk(module.tree):
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [known(a.name) for a in node.names if a.name.split(".")[0] == root]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join([*base, node.module] if node.module else base)
            else:
                stem = node.module or ""
            if stem.split(".")[0] == root:
                targets = [
                    f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else known(stem)
                    for a in node.names
                ]
        found += [Import(module.name, t, node.lineno) for t in targets if t and t != module.name]
    return found


def external_imports(module: Module, root: str) -> list[tuple[str, int]]:
    """(dotted name, line) of each absolute import of a module outside package `root`; for
    `from a.b import c`, `a.b`."""
    found = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] != root]
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and node.module
            and node.module.split(".")[0] != root
        ):
            found.append((node.module, node.lineno))
    return found


def part_of(name: str) -> str:
    """The layer a module belongs to: `schedule_search.sweep.driver` -> `sweep`,
    `schedule_search.cli` -> `cli`, the package itself -> ``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_violations(
    modules: dict[str, Module], layers: tuple[str, ...], no_ray: tuple[str, ...]
) -> list[str]:
    """Every import against the layers, as `file:line: a -> b (why)`: of a part above the
    importer's, and of any `ray` module by a part in `no_ray`; and each module in no layer."""
    root = next(iter(modules)).split(".")[0]
    rank = {"": -1} | {part: i for i, part in enumerate(layers)}
    wrong: list[tuple[str, int, str]] = []
    for module in modules.values():
        source = part_of(module.name)
        if source not in rank:
            wrong.append((module.file, 0, f"{module.name} is in no layer"))
            continue
        for imp in imports_of(module, modules):
            target = part_of(imp.target)
            if rank.get(target, len(layers)) > rank[source]:
                why = f"{source or root} may not import {target}, above it"
                wrong.append((module.file, imp.line, f"{module.name} -> {imp.target} ({why})"))
        if source in no_ray:
            wrong += [
                (module.file, line, f"{module.name} -> {name} ({source} imports no ray)")
                for name, line in external_imports(module, root)
                if name.split(".")[0] == "ray"
            ]
    return [f"{file}:{line}: {text}" for file, line, text in sorted(wrong)]


def import_cycles(modules: dict[str, Module]) -> list[list[Import]]:
    """One cycle of imports (its edges, in order) for each group of modules that import one
    another, found as the graph's strongly connected components (Tarjan)."""
    edges: dict[str, dict[str, Import]] = {name: {} for name in modules}
    for module in modules.values():
        for imp in imports_of(module, modules):
            edges[module.name].setdefault(imp.target, imp)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in edges[name]:
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:  # `name` and what lies above it on the stack
            group = set(stack[stack.index(name) :])
            del stack[stack.index(name) :]
            if len(group) > 1:
                groups.append(group)

    for name in sorted(modules):
        if name not in index:
            visit(name)
    return [shortest_cycle(min(group), group, edges) for group in groups]


def shortest_cycle(start: str, group: set[str], edges: dict[str, dict[str, Import]]):
    """The shortest chain of imports from `start` back to itself, inside `group`."""
    paths: dict[str, list[Import]] = {start: []}
    frontier = [start]
    while frontier:
        following = []
        for name in frontier:
            for target, imp in sorted(edges[name].items()):
                if target == start:
                    return [*paths[name], imp]
                if target in group and target not in paths:
                    paths[target] = [*paths[name], imp]
                    following.append(target)
        frontier = following
    raise AssertionError(f"{sorted(group)} is no cycle")


def functions(modules: dict[str, Module]):
    """(qualified name, module, def node) of every function and method, nested ones too."""

    def walk(node: ast.AST, prefix: str, module: Module):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}.{child.name}"
                if not isinstance(child, ast.ClassDef):
                    yield name, module, child
                yield from walk(child, name, module)
            else:
                yield from walk(child, prefix, module)

    for module in modules.values():
        yield from walk(module.tree, module.name, module)


def length(node: ast.AST) -> int:
    """Lines from the `def` line to the body's last line (decorators not counted)."""
    return node.end_lineno - node.lineno + 1


def cycle_report(modules: dict[str, Module]) -> list[str]:
    """Each cycle as `a -> b (a's file:line importing b) -> ... -> a (...)`."""
    return [
        " -> ".join(
            [cycle[0].source]
            + [f"{imp.target} ({modules[imp.source].file}:{imp.line})" for imp in cycle]
        )
        for cycle in import_cycles(modules)
    ]


def long_modules(modules: dict[str, Module], limit: int) -> list[str]:
    return [
        f"{m.name} ({m.file}): {m.lines} lines (limit {limit})"
        for m in modules.values()
        if m.lines > limit
    ]


def long_functions(modules: dict[str, Module], limit: int) -> list[str]:
    return [
        f"{name} ({module.file}:{node.lineno}): {length(node)} lines (limit {limit})"
        for name, module, node in functions(modules)
        if length(node) > limit
    ]


MODULES = read_modules(PACKAGE)


def test_the_package_is_read():
    """The checks below see the real package, not an empty or wrong folder."""
    assert {"schedule_search.cli", "schedule_search.train.loop"} <= set(MODULES)
    assert len(MODULES) > 30 and sum(1 for _ in functions(MODULES)) > 200


def test_no_import_cycles():
    cycles = cycle_report(MODULES)
    assert not cycles, "import cycles among the package's modules:\n  " + "\n  ".join(cycles)


def test_no_module_over_400_lines():
    long = long_modules(MODULES, MAX_MODULE_LINES)
    assert not long, "modules too long:\n  " + "\n  ".join(long)


def test_no_function_over_80_lines():
    long = long_functions(MODULES, MAX_FUNCTION_LINES)
    assert not long, "functions too long:\n  " + "\n  ".join(long)


def test_imports_go_only_down_the_layers():
    wrong = layer_violations(MODULES, LAYERS, NO_RAY)
    assert not wrong, (
        f"imports against the layers ({' < '.join(LAYERS)}; no ray in {', '.join(NO_RAY)}):\n  "
        + "\n  ".join(wrong)
    )


def test_the_checks_find_what_is_planted(tmp_path):
    """Each check reports a planted fault: a cycle through an import inside a function and a
    relative import, a module and a function one line over their limits."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("from ..c import x\n")
    (package / "c.py").write_text("import pkg.a\n" + "x = 1\n" * 9)
    body = "".join(f"    x{i} = {i}\n" for i in range(4))
    (package / "d.py").write_text(f"def long():\n{body}\n\ndef short():\n    pass\n")
    modules = read_modules(package)
    assert cycle_report(modules) == [
        "pkg.a -> pkg.sub.b (pkg/a.py:2) -> pkg.c (pkg/sub/b.py:1) -> pkg.a (pkg/c.py:1)"
    ]
    assert long_modules(modules, 9) == ["pkg.c (pkg/c.py): 10 lines (limit 9)"]
    assert long_functions(modules, 4) == ["pkg.d.long (pkg/d.py:1): 5 lines (limit 4)"]


def test_the_layer_check_finds_what_is_planted(tmp_path):
    """An upward import inside a function and through a relative import, Ray imported lazily
    in a part that must not, and a part in no layer are each reported; downward imports and
    Ray where it is allowed are not."""
    package = tmp_path / "pkg"
    for part in ("low", "high"):
        (package / part).mkdir(parents=True)
        (package / part / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "low" / "a.py").write_text(
        "import json\n\n\ndef f():\n    from pkg.high import b\n    import ray.tune\n"
    )
    (package / "low" / "c.py").write_text("from ..high.b import x\nfrom ray import tune\n")
    (package / "high" / "b.py").write_text("import ray\nfrom pkg.low import a\nx = 1\n")
    (package / "top.py").write_text("from pkg import high\n")
    (package / "stray.py").write_text("")
    modules = read_modules(package)
    assert layer_violations(modules, ("low", "high", "top"), ("low",)) == [
        "pkg/low/a.py:5: pkg.low.a -> pkg.high.b (low may not import high, above it)",
        "pkg/low/a.py:6: pkg.low.a -> ray.tune (low imports no ray)",
        "pkg/low/c.py:1: pkg.low.c -> pkg.high.b (low may not import high, above it)",
        "pkg/low/c.py:2: pkg.low.c -> ray (low imports no ray)",
        "pkg/stray.py:0: pkg.stray is in no layer",
    ]
