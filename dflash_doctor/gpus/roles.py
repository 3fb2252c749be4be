"""GPU roles (`--roles target=0-4,drafter=5-7`) and the thread -> GPU mapping `status` uses.

Mapping rule: a thread named ROLE-N (drafter-0, target-3) runs on the N-th GPU of ROLE in the order --roles lists
them (drafter=5-7: drafter-0 -> 5, drafter-2 -> 7). `--map drafter-0=5` overrides or adds single threads.
"""
from __future__ import annotations

import re
from typing import Dict, Iterable, Optional, Tuple

from dflash_doctor.errors import UsageError
from dflash_doctor.gpus.csv_snapshot import MAX_GPU_INDEX

RoleMap = Dict[str, Tuple[int, ...]]

_ROLE_NAME = re.compile(r"^[A-Za-z_][\w.-]*$")
_THREAD_ROLE = re.compile(r"^(?P<role>[A-Za-z_][\w.]*?)[-_](?P<n>\d+)$")


def _indices(token: str, spec: str) -> Iterable[int]:
    token = token.strip()
    match = re.fullmatch(r"(\d{1,12})(?:-(\d{1,12}))?", token)
    if not match:
        raise UsageError(f"--roles {spec[:80]!r}: {token[:40]!r} is not a GPU index or a range like 0-4")
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) is not None else first
    if last > MAX_GPU_INDEX:
        raise UsageError(f"--roles: GPU {last} is beyond {MAX_GPU_INDEX}; no host has that many GPUs")
    if last < first:
        raise UsageError(f"--roles {spec!r}: range {token!r} runs backwards")
    return range(first, last + 1)


def parse_roles(spec: Optional[str]) -> RoleMap:
    """'target=0-4,drafter=5-7' or 'target=0,1,3-4,drafter=5' -> {'target': (0,...,4), 'drafter': (5, 6, 7)}.

    A comma-separated token without '=' extends the role before it. Malformed -> UsageError (one line, exit 2).
    """
    if spec is None:
        return {}
    if not spec.strip():
        raise UsageError("--roles is empty; expected e.g. target=0-4,drafter=5-7")
    roles: Dict[str, list] = {}
    owner: Dict[int, str] = {}
    current: Optional[str] = None
    for raw in spec.split(","):
        token = raw.strip()
        if not token:
            raise UsageError(f"--roles {spec!r}: empty item between commas")
        if "=" in token:
            name, _, token = (part.strip() for part in token.partition("="))
            if not _ROLE_NAME.match(name):
                raise UsageError(f"--roles {spec!r}: {name!r} is not a role name")
            if name in roles:
                raise UsageError(f"--roles {spec!r}: role {name!r} given twice")
            roles[name] = []
            current = name
        if current is None:
            raise UsageError(f"--roles {spec!r}: {token!r} comes before any ROLE=")
        for index in _indices(token, spec):
            if index in owner:
                raise UsageError(f"--roles {spec!r}: GPU {index} is in both {owner[index]!r} and {current!r}")
            owner[index] = current
            roles[current].append(index)
    return {name: tuple(indices) for name, indices in roles.items()}


def role_of(roles: RoleMap) -> Dict[int, str]:
    return {index: name for name, indices in roles.items() for index in indices}


def parse_thread_map(items: Iterable[str]) -> Dict[str, int]:
    """`--map drafter-0=5` (repeatable, or comma-separated) -> {'drafter-0': 5}."""
    mapping: Dict[str, int] = {}
    items = list(items)
    if items and not any(t.strip() for item in items for t in item.split(",")):
        raise UsageError(f"--map {','.join(items)[:80]!r} names no THREAD=GPU pair, e.g. drafter-0=5")
    for item in items:
        for token in filter(None, (t.strip() for t in item.split(","))):
            thread, sep, gpu = token.rpartition("=")
            if not sep or not thread.strip() or not gpu.strip().isdigit():
                raise UsageError(f"--map {token[:80]!r}: expected THREAD=GPU, e.g. drafter-0=5")
            if int(gpu) > MAX_GPU_INDEX:
                raise UsageError(f"--map {token[:80]!r}: GPU {gpu.strip()[:20]} is beyond {MAX_GPU_INDEX}")
            mapping[thread.strip()] = int(gpu)
    return mapping


def gpu_for_thread(thread: str, roles: RoleMap, overrides: Optional[Dict[str, int]] = None) -> Optional[int]:
    """The GPU a thread runs on: an explicit --map entry, else ROLE-N -> the N-th GPU of ROLE, else None."""
    if overrides and thread in overrides:
        return overrides[thread]
    match = _THREAD_ROLE.match(thread)
    if not match:
        return None
    indices = roles.get(match.group("role"))
    n = int(match.group("n"))
    if indices is None or n >= len(indices):
        return None
    return indices[n]
