"""Read, from a torch's own source, whether a value assigned to a compile config module reaches every thread.

In `utils/_config_module.py` (AST only, nothing imported), `ConfigModule.__setattr__` is what
`torch._dynamo.config.x = v` (and `_inductor`, `_functorch`) runs. Where it puts the value decides the reach:

- `<entry>.user_override.set(value)` on a `_ConfigEntry` whose `user_override` is a `ContextVar` (2.12 and later):
  the value lives in the assigning thread's context; a thread started later begins with an empty context and reads
  the default. **Per thread.**
- `self._config[name].user_override = value` (2.6-2.11) or `self._config[name] = value` (2.4-2.5): an attribute or
  item of the module object, which every thread shares. **Process-wide.**

Both marks are read, not the version: the ContextVar construction (or annotation) on `user_override`, and the
`.set(` call in `__setattr__`; either alone is reported as such in the notes. docs/guards-releases.md shows what
each release decides; docs/races.md says what that means for the fixes.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from dflash_doctor.compile_settings import SETTINGS, SettingRole
from dflash_doctor.guards.pyindex import FUNCTION_DEFS, Index, Module

CONFIG_MODULE = "utils/_config_module.py"
PER_THREAD, PROCESS_WIDE, UNKNOWN = "per-thread", "process-wide", "unknown"


@dataclass(frozen=True)
class ConfigStorage:
    """Where `ConfigModule.__setattr__` keeps an assigned value; lines are None where the source did not say."""

    storage: str = UNKNOWN
    file: Optional[str] = None
    write_line: Optional[int] = None  # the store in __setattr__
    contextvar_line: Optional[int] = None  # where user_override is made (or declared) a ContextVar
    notes: Tuple[str, ...] = field(default_factory=tuple)

    @property
    def per_thread(self) -> Optional[bool]:
        return {PER_THREAD: True, PROCESS_WIDE: False}.get(self.storage)

    def to_dict(self) -> dict:
        return {"storage": self.storage, "per_thread": self.per_thread, "file": self.file,
                "write_line": self.write_line, "contextvar_line": self.contextvar_line, "notes": list(self.notes),
                "consequences": list(consequences(self.per_thread))}


def read_config_storage(index: Index) -> ConfigStorage:
    module = index.module(CONFIG_MODULE)
    display = index.tree.display_path(CONFIG_MODULE)
    if module is None:
        return ConfigStorage(notes=(f"no readable {display}: where compile settings live was not read",))
    setattr_def = _method(module, "ConfigModule", "__setattr__")
    if setattr_def is None:
        return ConfigStorage(file=display, notes=(f"no ConfigModule.__setattr__ in {display}",))
    sets: List[ast.Call] = [n for n in ast.walk(setattr_def) if isinstance(n, ast.Call) and _is_override_set(n)]
    contextvar_line = _contextvar_line(module)
    if sets and contextvar_line is not None:
        return ConfigStorage(PER_THREAD, display, sets[0].lineno, contextvar_line, (
            f"ConfigModule.__setattr__ stores an assigned value with user_override.set() ({display}:"
            f"{sets[0].lineno}) in a ContextVar ({display}:{contextvar_line}): a thread started later reads the "
            "default",))
    stores: List[ast.Assign] = [n for n in ast.walk(setattr_def) if isinstance(n, ast.Assign)
                                and any(_is_shared_store(t) for t in n.targets)]
    if stores and not sets:
        return ConfigStorage(PROCESS_WIDE, display, stores[0].lineno, None, (
            f"ConfigModule.__setattr__ stores an assigned value on the module's own entries ({display}:"
            f"{stores[0].lineno}): every thread reads it",))
    notes: List[str] = []
    if sets:
        notes.append(f"user_override.set() in ConfigModule.__setattr__ ({display}:{sets[0].lineno}) but no "
                     "ContextVar made for it")
    if contextvar_line is not None:
        notes.append(f"a ContextVar for user_override ({display}:{contextvar_line}) but no .set() in __setattr__")
    return ConfigStorage(UNKNOWN, display, None, contextvar_line,
                         tuple(notes) or (f"ConfigModule.__setattr__ in {display} stores no way this reader knows",))


def _method(module: Module, class_name: str, name: str):
    owner = module.classes.get(class_name)
    return next((node for node in (owner.body if owner else []) if isinstance(node, FUNCTION_DEFS)
                 and node.name == name), None)


def _is_override_set(node: ast.AST) -> bool:
    """`<x>.user_override.set(...)`."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "set"
            and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "user_override")


def _is_shared_store(target: ast.AST) -> bool:
    """`self._config[name].user_override = v` or `self._config[name] = v`."""
    if isinstance(target, ast.Attribute) and target.attr == "user_override":
        target = target.value
    return (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute)
            and target.value.attr == "_config")


def _contextvar_line(module: Module) -> Optional[int]:
    """The line making `user_override` a ContextVar in _ConfigEntry: `self.user_override = ContextVar(...)` or
    the annotation `user_override: ContextVar[...]`."""
    entry = module.classes.get("_ConfigEntry")
    if entry is None:
        return None
    for node in ast.walk(entry):
        if isinstance(node, ast.AnnAssign) and _names_user_override(node.target) and "ContextVar" in ast.dump(
                node.annotation):
            return node.lineno
        if isinstance(node, ast.Assign) and any(_names_user_override(t) for t in node.targets) and isinstance(
                node.value, ast.Call) and "ContextVar" in ast.dump(node.value.func):
            return node.lineno
    return None


def _names_user_override(target: ast.AST) -> bool:
    return (isinstance(target, ast.Name) and target.id == "user_override") or (
        isinstance(target, ast.Attribute) and target.attr == "user_override")


def consequences(per_thread: Optional[bool]) -> Tuple[str, ...]:
    """What the storage means for every config-based fix in the registry and for silencing the FX error."""
    from dflash_doctor import mitigations as registry

    if per_thread is False:
        return ("a compile setting assigned in any thread reaches every thread (process-wide): the config-based "
                "fixes apply as set, once",)
    when = "this release keeps" if per_thread else "if this release keeps (not read)"
    lines = []
    for entry in registry.REGISTRY:
        settings = [s.setting for s in entry.switches if s.setting in {c.dotted for c in SETTINGS}]
        if settings:
            lines.append(f"{entry.name}: {when} compile settings per thread, so `{settings[0]} = "
                         f"{entry.switches[0].value!r}` in the main thread leaves every worker at the default; "
                         f"apply it as `{entry.api.split('  #')[0]}` before the workers start (it also sets it in "
                         "threads started later) or per worker thread")
    silencing = [s.dotted for s in SETTINGS if s.role is SettingRole.SILENCES_FX_ERROR]
    lines.append(f"{' and '.join(silencing)} assigned in the main thread do not reach the workers: a worker still "
                 "raises the FX error (DFD603 reads the main thread only); set in a worker, they silence that "
                 "worker alone, which then runs uncompiled code")
    limits = [s.dotted for s in SETTINGS if s.role is SettingRole.RECOMPILE_LIMIT]
    lines.append(f"{limits[0]} (and {', '.join(limits[1:])}) raised in the main thread leave the workers at the "
                 "default limit")
    return tuple(lines)


__all__ = ["CONFIG_MODULE", "ConfigStorage", "PER_THREAD", "PROCESS_WIDE", "UNKNOWN", "consequences",
           "read_config_storage"]
