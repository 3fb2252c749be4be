"""What this machine and this torch can show, decided before any trial runs, so a run never spends minutes on a
stress that cannot reproduce anything here, and says so up front.

- The deadlock needs a lazily compiled backward: without a backward (the reference drafter on a CPU, where
  flex_attention has none) it cannot form.
- A compile leaks the FX flag into other threads only where the flag is a module global that compiles do not
  mask (torch 2.13 holds the process-global is-compiling flag for the whole compile, which hides it).
- Forced and stuck need a module-global flag: a thread-local one (torch >= 2.14) cannot leak at all.
Where the installed source cannot be read, every stress runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

from dflash_doctor.hazards import Stress
from dflash_doctor.repro.facts import CapabilitiesFacts

LayoutTraits = Tuple[Optional[str], Optional[bool], Optional[str]]  # (storage, masked during compile, version)


def installed_traits() -> LayoutTraits:
    """The installed torch's FX-flag storage and compile masking, read from its source (no import)."""
    from dflash_doctor.guards.layout import UNKNOWN, read_layout
    from dflash_doctor.guards.torch_sources import installed_torch_root

    root = installed_torch_root()
    if root is None:
        return None, None, None
    try:
        layout = read_layout(root)
    except Exception:  # noqa: BLE001 - an unreadable layout only means "assume every stress can show something"
        return None, None, None
    storage = None if layout.fx_flag_storage == UNKNOWN else layout.fx_flag_storage
    return storage, layout.masked_during_compile, layout.torch_version


@dataclass(frozen=True)
class Capabilities:
    skipped: Dict[Stress, str] = field(default_factory=dict)
    cannot_show: Tuple[str, ...] = ()  # printed before the first trial
    flag_storage: Optional[str] = None
    masked_during_compile: Optional[bool] = None
    torch_version: Optional[str] = None  # as read from the installed source

    def to_dict(self) -> CapabilitiesFacts:
        return {"skipped": {s.value: why for s, why in self.skipped.items()}, "cannot_show": list(self.cannot_show),
                "fx_flag_storage": self.flag_storage, "masked_during_compile": self.masked_during_compile,
                "torch_version": self.torch_version}


def assess(backward: bool, on_cpu: bool, traits: Callable[[], LayoutTraits] = installed_traits,
           user_code: bool = False) -> Capabilities:
    """What can show here. `user_code`: the workers run the user's --step or --model, which may call backward
    on its own, start threads or trace with FX: the natural and amplified stresses are never skipped for it (only
    the step knows what it does), and the notes say what holds whatever the step does."""
    storage, masked, version = traits()
    release = f"torch {version}" if version else "this torch"
    skipped: Dict[Stress, str] = {}
    lines = []
    deadlock_possible = backward and not (user_code and on_cpu)
    if user_code and on_cpu:
        # A CPU-only graph's backward runs on the thread that called it: there is no autograd device thread for
        # a compile holding compile_lock to wait on (docs/races.md, "The deadlock").
        lines.append("on a CPU each backward runs on the thread that calls it (no autograd device thread), so "
                     "the compile-lock / autograd deadlock cannot form here, whatever the step does")
    elif not backward:
        lines.append("no backward in this run (flex_attention has no CPU backward), so the compile-lock / autograd "
                     "deadlock cannot form here" if on_cpu else
                     "no backward in this run (--no-backward), so the compile-lock / autograd deadlock cannot form")
    compile_leak_possible = storage != "thread-local" and not masked
    if masked:
        lines.append(f"{release} masks the FX flag while any thread compiles, so a compile cannot leak it into "
                     "another thread; a foreign FX trace still can (forced)")
    if storage == "thread-local":
        lines.append(f"{release} keeps the FX flag per thread: no trace can leak it into another thread")
        for stress in (Stress.FORCED, Stress.STUCK):
            skipped[stress] = f"the FX flag is thread-local in {release}"
    if not deadlock_possible and not compile_leak_possible and not user_code:
        reasons = ["no backward"] + (["compiles mask the FX flag"] if masked else []) + (
            ["the FX flag is thread-local"] if storage == "thread-local" else [])
        skipped[Stress.NATURAL] = skipped[Stress.AMPLIFIED] = (
            "nothing can race naturally here: " + " and ".join(reasons))
    return Capabilities(skipped, tuple(lines), storage, masked, version)
