"""What the probe host tells `guards`, typed, and its one codec.

Two process boundaries, one module: a probe forked by the host (isolation.py) sends its `ProbeResult` up a pipe
(`encode_result` / `decode_result`), and the host (probe_host.py) prints one `HostDocument` on the last line of its
stdout (`encode` / `decode`), which guards' runner.py reads. Both ends go through this module, so a renamed field
fails here and loudly. `decode` and `decode_result` are strict: the version must match and every field must be
there with its type; anything else is a `HostDocumentError`, which the runner turns into a probe error that names
what was wrong (a problem in the report, never a silent default).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from dflash_doctor.guards.state import CONFIG_FLAGS, LiveState
from dflash_doctor.outcomes import ProbeOutcome

HOST_DOCUMENT_VERSION = 1


class HostDocumentError(ValueError):
    """What the probe host (or a probe it forked) wrote is not a document of this version."""


@dataclass(frozen=True)
class ProbeResult:
    """One probe's answer. `detail` says what it saw; `error` why it could not answer (outcome `error`)."""

    outcome: ProbeOutcome
    seconds: Optional[float] = None  # None: it never ran, or its process died without saying
    detail: Optional[str] = None
    error: Optional[str] = None

    @classmethod
    def failed(cls, error: str, seconds: Optional[float] = None) -> "ProbeResult":
        return cls(ProbeOutcome.ERROR, None if seconds is None else round(seconds, 3), error=error)

    def to_facts(self) -> Dict[str, Any]:
        """The entry of guards' `facts.probe_details` (the JSON keeps only the texts the probe gave)."""
        facts: Dict[str, Any] = {"outcome": self.outcome, "seconds": self.seconds}
        if self.detail is not None:
            facts["detail"] = self.detail
        if self.error is not None:
            facts["error"] = self.error
        return facts


@dataclass(frozen=True)
class HostSeconds:
    imported: float  # from the host's start to torch and Dynamo imported
    total: float  # ... to the document written


@dataclass(frozen=True)
class HostDocument:
    state: LiveState  # the fresh interpreter's config flags and FX flag (read before any probe), its GPU count
    probes: Mapping[str, ProbeResult]  # the probes it was asked for, by name
    seconds: HostSeconds


# -- writing ---------------------------------------------------------------------------------------------------
def _result_dict(result: ProbeResult) -> Dict[str, Any]:
    return {"outcome": result.outcome.value, "seconds": result.seconds, "detail": result.detail, "error": result.error}


def encode_result(result: ProbeResult) -> bytes:
    return json.dumps({"version": HOST_DOCUMENT_VERSION, **_result_dict(result)}).encode("utf-8")


def encode(document: HostDocument) -> str:
    """One line of JSON (the host prints it last on stdout)."""
    state = document.state
    return json.dumps({
        "version": HOST_DOCUMENT_VERSION,
        "state": {"config": dict(state.config), "fx_flag_now": state.fx_flag_now, "gpu_count": state.gpu_count},
        "probes": {name: _result_dict(result) for name, result in document.probes.items()},
        "seconds": {"import": document.seconds.imported, "total": document.seconds.total},
    })


# -- reading ---------------------------------------------------------------------------------------------------
def _object(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise HostDocumentError(f"{what} is not an object")
    return value


def _field(data: Mapping[str, Any], key: str) -> Any:
    if key not in data:
        raise HostDocumentError(f"missing field {key!r}")
    return data[key]


def _optional_str(data: Mapping[str, Any], key: str) -> Optional[str]:
    value = _field(data, key)
    if value is not None and not isinstance(value, str):
        raise HostDocumentError(f"{key!r} is not a string")
    return value


def _optional_bool(data: Mapping[str, Any], key: str) -> Optional[bool]:
    value = _field(data, key)
    if value is not None and not isinstance(value, bool):
        raise HostDocumentError(f"{key!r} is not true, false or null")
    return value


def _number(data: Mapping[str, Any], key: str) -> float:
    value = _field(data, key)
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise HostDocumentError(f"{key!r} is not a number of seconds: {str(value)[:40]}")
    return float(value)


def _version(data: Mapping[str, Any]) -> None:
    version = _field(data, "version")
    if version != HOST_DOCUMENT_VERSION:
        raise HostDocumentError(f"a document of version {str(version)[:20]}, this reader knows {HOST_DOCUMENT_VERSION}")


def _result(value: Any) -> ProbeResult:
    data = _object(value, "a probe result")
    word = _field(data, "outcome")
    try:
        outcome = ProbeOutcome(word)
    except ValueError:
        raise HostDocumentError(f"'outcome' is not a probe outcome: {str(word)[:40]}") from None
    seconds = None if _field(data, "seconds") is None else _number(data, "seconds")
    return ProbeResult(outcome, seconds, _optional_str(data, "detail"), _optional_str(data, "error"))


def _state(value: Any) -> LiveState:
    data = _object(value, "'state'")
    config = _object(_field(data, "config"), "'config'")
    flags = {name: _optional_bool(config, name) for name in CONFIG_FLAGS}
    count = _field(data, "gpu_count")
    if type(count) is not int or count < 0:
        raise HostDocumentError(f"'gpu_count' is not a count: {str(count)[:40]}")
    return LiveState(flags, _optional_bool(data, "fx_flag_now"), count)


def _loads(text: Any) -> Mapping[str, Any]:
    try:
        return _object(json.loads(text), "the document")
    except (ValueError, TypeError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise HostDocumentError(f"not JSON ({type(exc).__name__}: {str(exc)[:200]})") from None


def decode_result(data: bytes) -> ProbeResult:
    """The result `encode_result` wrote, or HostDocumentError."""
    raw = _loads(data)
    _version(raw)
    return _result(raw)


def decode(text: str) -> HostDocument:
    """The document `encode` wrote, or HostDocumentError."""
    raw = _loads(text)
    _version(raw)
    probes = _object(_field(raw, "probes"), "'probes'")
    seconds = _object(_field(raw, "seconds"), "'seconds'")
    return HostDocument(_state(_field(raw, "state")), {str(name): _result(result) for name, result in probes.items()},
                        HostSeconds(_number(seconds, "import"), _number(seconds, "total")))
