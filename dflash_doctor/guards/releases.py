"""What each torch release's source says, read once from its wheel: corroboration and upgrade targets, never
the verdict.

Every row was produced by `python benchmarks/guards_releases.py` (the real wheels, unpacked) and is checked against
them there; docs/guards-releases.md shows the rows with the file:line each value came from. `guards` always decides
from the source it reads: a row that disagrees (a patched build, a backport, a nightly) is reported, and a release
with no row says the table was not consulted. The upgrade advice names a later release, so it reads that
release's row.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Optional, Tuple

from dflash_doctor.guards.layout import MODULE_GLOBAL, THREAD_LOCAL, Layout


@dataclass(frozen=True)
class ReleaseRow:
    release: str  # major.minor
    read_from: str  # the wheel's version
    predicate: str  # what compile_wrapper calls
    fx_flag_storage: str
    fx_flag_restores_saved_value: bool  # Tracer.trace's save/set/restore
    masked_during_compile: bool  # the predicate consults is_compiling() and Dynamo compiles set it
    compiling_flag_storage: str
    compile_sets_compiling_flag: bool
    backward_compile_takes_compile_lock: bool
    lazy_backward: bool  # AOTAutograd compiles the backward at the first backward call
    non_lazy_backward_available: bool  # torch._functorch.config.force_non_lazy_backward_lowering
    fx_patches_isolated: bool = False  # Tracer.trace's nn.Module patches kept to the tracing thread (patcher.py)
    # An assigned compile setting lives in the assigning thread's ContextVar (config_storage.py): 2.12 and later.
    compile_settings_per_thread: bool = False


def release_of(version: Optional[str]) -> Optional[str]:
    match = re.match(r"^(\d+)\.(\d+)", version or "")
    return f"{match.group(1)}.{match.group(2)}" if match else None


def _row(read_from: str, predicate: str, storage: str, masked: bool, compile_sets: bool, takes_lock: bool,
         non_lazy: bool, settings_per_thread: bool = False) -> ReleaseRow:
    # Constant across 2.4-2.15 as read: save/set/restore in Tracer.trace, a module-global compiling flag, a
    # backward compiled on first use, and nn.Module patched on the class with a module-global CURRENT_PATCHER.
    return ReleaseRow(release_of(read_from) or read_from, read_from, predicate, storage, True, masked,
                      MODULE_GLOBAL, compile_sets, takes_lock, True, non_lazy,
                      compile_settings_per_thread=settings_per_thread)


_TRACING, _SYMBOLIC = "is_fx_tracing", "is_fx_symbolic_tracing"
# The last column: compile settings per thread (utils/_config_module.py keeps an assigned value in a ContextVar).
TABLE: Tuple[ReleaseRow, ...] = (
    _row("2.4.1", _TRACING, MODULE_GLOBAL, False, False, False, False),
    _row("2.5.1", _TRACING, MODULE_GLOBAL, False, False, False, False),
    _row("2.6.0", _TRACING, MODULE_GLOBAL, False, False, True, False),
    _row("2.7.1", _TRACING, MODULE_GLOBAL, False, False, True, False),
    _row("2.8.0", _TRACING, MODULE_GLOBAL, False, False, True, False),
    _row("2.9.1", _SYMBOLIC, MODULE_GLOBAL, False, False, True, False),
    _row("2.10.0", _SYMBOLIC, MODULE_GLOBAL, False, False, True, True),
    _row("2.11.0", _SYMBOLIC, MODULE_GLOBAL, False, False, True, True),
    _row("2.12.0", _SYMBOLIC, MODULE_GLOBAL, False, False, True, True, True),
    _row("2.13.0", _SYMBOLIC, MODULE_GLOBAL, True, True, True, True, True),
    _row("2.14.1", _SYMBOLIC, THREAD_LOCAL, True, True, True, True, True),
    _row("2.15.0", _SYMBOLIC, THREAD_LOCAL, True, True, True, True, True),
)
_COMPARED = ("predicate", "fx_flag_storage", "fx_flag_restores_saved_value", "masked_during_compile",
             "compiling_flag_storage", "compile_sets_compiling_flag", "backward_compile_takes_compile_lock",
             "lazy_backward", "non_lazy_backward_available", "fx_patches_isolated", "compile_settings_per_thread")


def release_key(release: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


def row_for(version: Optional[str]) -> Optional[ReleaseRow]:
    release = release_of(version)
    return next((row for row in TABLE if row.release == release), None)


def later_rows(version: Optional[str]) -> Tuple[ReleaseRow, ...]:
    """The table's releases after `version` (none when the version is not known)."""
    release = release_of(version)
    if release is None:
        return ()
    return tuple(row for row in TABLE if release_key(row.release) > release_key(release))


def read_values(layout: Layout) -> dict:
    """The table's columns as read from `layout` (None where the source did not say)."""
    guard, flag, compiling, backward = layout.guard, layout.fx_flag, layout.compiling_flag, layout.backward
    return {
        "predicate": guard.predicate_qualname.rsplit(".", 1)[-1] if guard and guard.predicate_qualname else None,
        "fx_flag_storage": layout.fx_flag_storage,
        "fx_flag_restores_saved_value": flag.restores_saved_value if flag else None,
        "masked_during_compile": layout.masked_during_compile,
        "compiling_flag_storage": compiling.storage if compiling else None,
        "compile_sets_compiling_flag": layout.compile_sets_compiling_flag,
        "backward_compile_takes_compile_lock": backward.takes_lock,
        "lazy_backward": backward.lazy_backward,
        "non_lazy_backward_available": backward.non_lazy_available,
        "fx_patches_isolated": layout.fx_patches.isolated,
        "compile_settings_per_thread": layout.compile_settings.per_thread,
    }


def corroborate(layout: Layout) -> dict:
    """The table's row for the release read, beside what was read; `consulted` False when there is no row."""
    release = release_of(layout.torch_version)
    row = row_for(layout.torch_version)
    span = f"{TABLE[0].release}-{TABLE[-1].release}"
    if row is None:
        return {"release": release, "consulted": False, "table_releases": span, "table_row": None,
                "agrees": None, "differences": []}
    expected = {key: value for key, value in asdict(row).items() if key in _COMPARED}
    found = read_values(layout)
    differences = [key for key in _COMPARED if found[key] != expected[key]]
    return {"release": release, "consulted": True, "table_releases": span, "table_row": expected,
            "read_from": row.read_from, "agrees": not differences, "differences": differences}
