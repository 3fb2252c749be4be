"""Rule of the house 8 (docs/ARCHITECTURE.md): no imports go round in a circle. Every `import` and `from ... import`
of the package's own modules counts, those inside functions too (a lazy import is still an arrow: a rule table
that imports the catalog which imports every table is a circle however late it runs). The split of rules/logs
once made catalog -> rules/logs -> doctor_report -> catalog; this test names such a circle by its files."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set

PACKAGE = Path(__file__).resolve().parents[1] / "dflash_doctor"


def _module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(target: str, modules: Set[str]) -> str:
    """The module an imported name lives in: the name itself when it is a module, else its parent."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node but those under `if TYPE_CHECKING:`: an import only the type checker reads runs never."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            test = child.test if isinstance(child, ast.If) else None
            if test is not None and ast.unparse(test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                pending.extend(child.orelse)
                continue
            pending.append(child)


def import_graph(package: Path = PACKAGE) -> Dict[str, Set[str]]:
    files = {_module_name(p, package): p for p in package.rglob("*.py")}
    modules = set(files)
    graph: Dict[str, Set[str]] = {name: set() for name in modules}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name if is_package else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                targets = [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                found = _resolve(target, modules)
                if found and found != name:
                    graph[name].add(found)
    return graph


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm, iterative: no recursion limit)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_no_imports_go_round_in_a_circle():
    graph = import_graph()
    assert len(graph) > 200 and any(graph.values())  # (the walk found the package and its arrows)
    assert circles(graph) == []


def test_the_check_names_a_circle_made_by_a_lazy_import(tmp_path):
    package = tmp_path / "dflash_doctor"
    (package / "rules").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "rules" / "__init__.py").write_text("")
    (package / "rules" / "catalog.py").write_text("def load():\n    from dflash_doctor.rules import table\n")
    (package / "rules" / "table.py").write_text("from . import helper\n")
    (package / "rules" / "helper.py").write_text("def f():\n    from .catalog import load\n")
    (package / "rules" / "alone.py").write_text("import dflash_doctor.rules.table\n")
    (package / "rules" / "typed.py").write_text(  # a type-only import back: no arrow
        "from typing import TYPE_CHECKING\nimport dflash_doctor.rules.alone\nif TYPE_CHECKING:\n"
        "    from dflash_doctor.rules.typed_back import X\n")
    (package / "rules" / "typed_back.py").write_text("from dflash_doctor.rules import typed\n")
    graph = import_graph(package)
    assert circles(graph) == [["dflash_doctor.rules.catalog", "dflash_doctor.rules.helper",
                               "dflash_doctor.rules.table"]]
