"""The one way dflash-doctor starts a Python child (repro phases, guards probes, pipeline workers).

`python -m pkg` puts the working folder first on the child's import path, so a `torch.py` in the folder where a
user (or a CI job on a pull request) runs `dflash-doctor check .` would be imported and executed. A child
started by `python_argv` runs its module through a bootstrap whose first path entry is this package's own root
instead, and `child_env` keeps empty (= working folder) entries out of PYTHONPATH.

Only `--model pkg.module:factory` asks for user code, explicitly: `keep_working_folder=True` keeps the folder
importable for that child alone.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, List, Mapping, Optional

PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])

_BOOTSTRAP = (
    "import runpy, sys; sys.path[0] = {root!r}; {keep}"
    "sys.argv[0] = {module!r}; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
)


def python_argv(module: str, *args: str, python: Optional[str] = None, keep_working_folder: bool = False) -> List[str]:
    """argv running `module` as __main__ in a fresh interpreter that cannot import from the working folder."""
    keep = "sys.path.insert(1, __import__('os').getcwd()); " if keep_working_folder else ""
    code = _BOOTSTRAP.format(root=PACKAGE_ROOT, module=module, keep=keep)
    return [python or sys.executable, "-c", code, *map(str, args)]


def child_env(base: Optional[Mapping[str, str]] = None, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The child's environment: this package importable first, no working-folder entries, unbuffered output."""
    env = dict(os.environ if base is None else base)
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != "." and os.path.isabs(p)]
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT] + [p for p in kept if p != PACKAGE_ROOT])
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONSAFEPATH"] = "1"  # Python >= 3.11: no implicit working-folder entry, whatever starts the child
    env.update(extra or {})
    return env


def drop_working_folder_from_path() -> None:
    """For `python -m dflash_doctor`: the package is already imported, so the working folder need not stay on
    sys.path, where it would shadow torch (or anything) with a file of the same name."""
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", ".") and os.path.abspath(p) != cwd or p == PACKAGE_ROOT]
