"""The compile settings whose reach across threads matters, declared once.

From torch 2.12 on, a value assigned to `torch._dynamo.config`, `torch._inductor.config` or `torch._functorch.config`
is kept in a `ContextVar` (`torch/utils/_config_module.py`: `ConfigModule.__setattr__` stores a user override in a
context variable), so a thread started later begins with an empty context and reads the default: a setting assigned
once in the main thread never reaches the worker threads (docs/races.md, "Compile settings are per thread from 2.12").
On 2.11 and earlier the same assignment changed a module attribute and reached every thread.

Every part of the tool that reasons about such a setting reads this table: the fixes that switch one
(mitigations.py), `scan`'s rule for a setting assigned in one thread and relied on in threads started later, `run`'s
check of what a worker thread really reads, `guards`' per-release consequence, and `logs`' reading of a recompile
limit hit at its default in a worker. Importing this module never imports torch.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

# The first release whose compile settings are per thread (read in the 2.12.0, 2.13.0 and 2.14.1 wheels).
PER_THREAD_SINCE: Tuple[int, int] = (2, 12)


class SettingRole(str, enum.Enum):
    """Why a setting matters to the thread races: what a user who sets it is relying on."""

    DEADLOCK_FIX = "deadlock-fix"  # compiles the backward with the forward: no lazy compile on the autograd thread
    SILENCES_FX_ERROR = "silences-fx-error"  # turns the FX-tracing RuntimeError into an uncompiled (or forced) call
    RECOMPILE_LIMIT = "recompile-limit"  # how many recompiles before Dynamo gives up and runs the frame uncompiled


@dataclass(frozen=True)
class CompileSetting:
    module: str  # the config module, as user code imports it
    key: str
    role: SettingRole
    relied_on_as: str  # what a user who assigns it expects, in one clause

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.key}"


SETTINGS: Tuple[CompileSetting, ...] = (
    CompileSetting("torch._functorch.config", "force_non_lazy_backward_lowering", SettingRole.DEADLOCK_FIX,
                   "the backward compiled with the forward, so no worker compiles it lazily under the autograd thread"),
    CompileSetting("torch._dynamo.config", "error_on_nested_fx_trace", SettingRole.SILENCES_FX_ERROR,
                   "a compiled call made while another thread traces with FX runs uncompiled instead of raising"),
    CompileSetting("torch._dynamo.config", "force_compile_during_fx_trace", SettingRole.SILENCES_FX_ERROR,
                   "a compiled call made while another thread traces with FX compiles instead of raising"),
    CompileSetting("torch._dynamo.config", "recompile_limit", SettingRole.RECOMPILE_LIMIT,
                   "a frame may recompile this many times before Dynamo runs it uncompiled"),
    CompileSetting("torch._dynamo.config", "cache_size_limit", SettingRole.RECOMPILE_LIMIT,
                   "a frame may recompile this many times before Dynamo runs it uncompiled (the older name)"),
    CompileSetting("torch._dynamo.config", "accumulated_recompile_limit", SettingRole.RECOMPILE_LIMIT,
                   "all frames together may recompile this many times"),
)

_BY_DOTTED: Dict[str, CompileSetting] = {setting.dotted: setting for setting in SETTINGS}


def setting(dotted: str) -> Optional[CompileSetting]:
    """The declared setting for `torch._dynamo.config.recompile_limit`-style names, or None."""
    return _BY_DOTTED.get(dotted)


def per_thread(version: Tuple[int, int]) -> bool:
    """Whether a release keeps compile settings per thread, by its version alone (guards reads the source)."""
    return version >= PER_THREAD_SINCE
