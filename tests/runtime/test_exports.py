"""runtime/__init__.py names what trainers import three times: the lazy table (_MODULES, what `runtime.X` loads),
the imports under TYPE_CHECKING (what a type checker sees) and __all__. A new runtime function (a mitigation's, as
mitigations.py's `api` names) must be in all three; this test reads the file so none is forgotten."""
from __future__ import annotations

import ast
import importlib

from dflash_doctor import runtime
from tests.conftest import REPO

SOURCE = REPO / "dflash_doctor" / "runtime" / "__init__.py"


def _type_checking_imports() -> dict:
    tree = ast.parse(SOURCE.read_text(encoding="utf-8"))
    guard = next(node for node in tree.body if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                 and node.test.id == "TYPE_CHECKING")
    return {node.module.rpartition(".")[2]: tuple(sorted(alias.name for alias in node.names))
            for node in guard.body if isinstance(node, ast.ImportFrom) and node.module}


def _eager_imports() -> set:
    tree = ast.parse(SOURCE.read_text(encoding="utf-8"))
    return {alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("dflash_doctor.runtime.") for alias in node.names}


def test_the_lazy_table_the_type_checking_imports_and_all_name_the_same_functions():
    lazy = {module: tuple(sorted(names)) for module, names in runtime._MODULES.items()}
    assert _type_checking_imports() == lazy
    assert sorted(runtime.__all__) == sorted({name for names in lazy.values() for name in names} | _eager_imports())


def test_every_exported_name_loads_from_the_module_the_table_names():
    for module, names in runtime._MODULES.items():
        loaded = importlib.import_module(f"dflash_doctor.runtime.{module}")
        for name in names:
            assert getattr(runtime, name) is getattr(loaded, name), (module, name)
