"""Strict reading of a JSON document another process wrote: repro's codecs read through it (repro/phase_record.py:
a phase child's result; repro/warm_protocol.py: the warm-start server's lines) and run's records
(supervise/records.py) refuse deep nesting with its check. Standard library only: the run agent loads it inside the
user's interpreter.

Each accessor names the field it could not read and why; nothing falls back to a default. `error` is the codec's
own exception class (a WireError), so its callers catch one kind.
"""
from __future__ import annotations

import json
import math
from dataclasses import fields
from typing import Any, Callable, Dict, List, Optional, Tuple, Type, TypeVar, Union

_T = TypeVar("_T")


class WireError(ValueError):
    """What another process wrote is not the document this version reads."""


def load_json(data: Union[bytes, str], max_depth: int, error: Type[WireError] = WireError) -> Any:
    """The JSON value of `data`, refused when it is not JSON or nests deeper than `max_depth`."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise error(f"not JSON ({type(exc).__name__}: {str(exc)[:200]})") from None
    return check_depth(document, max_depth, error)


def check_depth(document: Any, max_depth: int, error: Callable[[str], Exception] = WireError) -> Any:
    """`document`, refused when it nests deeper than `max_depth` (checked without recursing; json.loads itself
    stops near 1,000 levels with a RecursionError)."""
    pending: List[Tuple[Any, int]] = [(document, 0)]
    while pending:
        item, level = pending.pop()
        if level > max_depth:
            raise error(f"nested more than {max_depth} levels deep")
        if isinstance(item, dict):
            pending.extend((child, level + 1) for child in item.values())
        elif isinstance(item, list):
            pending.extend((child, level + 1) for child in item)
    return document


def exact_fields(cls: Any, data: Any, version: int, what: str) -> Dict[str, Any]:
    """The keyword arguments of the dataclass `cls` in `data`, which its `to_dict` wrote: refused (ValueError,
    naming `what`) unless it is a dict of `version` with every field of `cls` and no other, so a field one side
    renamed or dropped fails where it is read, never reads as its default. `version` is checked, not passed on."""
    if not isinstance(data, dict) or data.get("version") != version:
        raise ValueError(f"not a {what} of version {version}")
    names = {item.name for item in fields(cls)} - {"version"}
    missing, unknown = names - set(data), set(data) - names - {"version"}
    if missing or unknown:
        raise ValueError(f"not a {what}: missing {sorted(missing)}, unknown {sorted(unknown)}")
    return {name: data[name] for name in names}


class Fields:
    """One JSON object of the record, read strictly: each accessor names the field it could not read."""

    def __init__(self, data: Any, what: str, error: Type[WireError] = WireError) -> None:
        if not isinstance(data, dict):
            raise error(f"{what} is not an object ({type(data).__name__})")
        self.data: Dict[str, Any] = data
        self.what, self.error = what, error

    def raw(self, key: str) -> Any:
        if key not in self.data:
            raise self.error(f"{self.what} has no field {key!r}")
        return self.data[key]

    def _fail(self, key: str, expected: str) -> WireError:
        return self.error(f"{self.what}'s {key!r} is not {expected}: {str(self.data[key])[:40]}")

    def text(self, key: str) -> str:
        value = self.raw(key)
        if not isinstance(value, str):
            raise self._fail(key, "a string")
        return value

    def integer(self, key: str) -> int:
        value = self.raw(key)
        if type(value) is not int or not -2 ** 63 <= value < 2 ** 63:
            raise self._fail(key, "an integer in range")
        return value

    def number(self, key: str) -> float:
        value = self.raw(key)
        if type(value) not in (int, float) or not math.isfinite(value):
            raise self._fail(key, "a finite number")
        return float(value)

    def flag(self, key: str) -> bool:
        value = self.raw(key)
        if not isinstance(value, bool):
            raise self._fail(key, "true or false")
        return value

    def optional(self, key: str, read: Callable[[str], _T]) -> Optional[_T]:
        return None if self.raw(key) is None else read(key)

    def items(self, key: str) -> List[Any]:
        value = self.raw(key)
        if not isinstance(value, list):
            raise self._fail(key, "a list")
        return value

    def texts(self, key: str) -> Tuple[str, ...]:
        values = self.items(key)
        if not all(isinstance(value, str) for value in values):
            raise self._fail(key, "a list of strings")
        return tuple(values)

    def mapping(self, key: str) -> Dict[str, Any]:
        value = self.raw(key)
        if not isinstance(value, dict):
            raise self._fail(key, "an object")
        return value

    def word(self, key: str, vocabulary: Callable[[str], _T]) -> _T:
        value = self.text(key)
        try:
            return vocabulary(value)
        except ValueError:
            raise self._fail(key, "one of its vocabulary") from None

    def version(self, expected: int) -> None:
        """The document's `version` field is `expected`, the only one this reader knows."""
        found = self.raw("version")
        if found != expected:
            raise self.error(f"{self.what} of version {str(found)[:20]}; this dflash-doctor reads version {expected}")
