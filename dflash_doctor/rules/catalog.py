"""Every rule table, loaded: `lookup` and `all_rules` over the whole registry.

Apart from registry.py so that the tables (which import the registry to register their rules) and the one module
that imports them all are not each other's imports. The tables load on the first lookup, not when `rules` is
imported: a command that never asks for a rule does not pay for the log rules' patterns.
"""
from __future__ import annotations

from typing import List, Optional

from dflash_doctor.rules.registry import _BY_NAME, RULES, Rule

_loaded = False


def load_all() -> None:
    """Import every domain's rule table (plain data modules: no torch, no NVML)."""
    global _loaded
    if _loaded:
        return
    # imported here, not at the top, so that loading them waits for the first lookup; in code order (they register)
    from dflash_doctor.rules import scan  # noqa: F401
    from dflash_doctor.rules import gpus  # noqa: F401
    from dflash_doctor.rules import logs  # noqa: F401
    from dflash_doctor.rules import guards  # noqa: F401
    from dflash_doctor.rules import repro  # noqa: F401
    from dflash_doctor.rules import pipeline  # noqa: F401
    from dflash_doctor.rules import live  # noqa: F401

    _loaded = True  # only once every table imported: a broken table fails every lookup, not just the first


def lookup(code_or_name: str) -> Optional[Rule]:
    load_all()
    key = code_or_name.strip()
    return RULES.get(key.upper()) or _BY_NAME.get(key.lower())


def all_rules() -> List[Rule]:
    load_all()
    return [RULES[c] for c in sorted(RULES)]
