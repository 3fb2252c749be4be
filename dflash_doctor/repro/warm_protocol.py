"""The warm-start server's line protocol (repro/warm_start.py), typed, and its one codec.

The harness writes a `ForkRequest` a line on the server's stdin; the server answers on stdout with `Ready` once,
`Forked` per request and `Exited` per child it reaped. Both sides write and read the lines through this module
and nothing else: a line of another version, or one missing a field, is a ProtocolError naming it (the harness
then starts its children fresh and says why). A line of the server's stdout that is not JSON at all is no
message (`decode_message` gives None): an import may print, and that is not the protocol speaking.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from dflash_doctor.wire import Fields, WireError, check_depth, load_json

PROTOCOL_VERSION = 1
MAX_DEPTH = 8  # the deepest line nests 2 (request > env > value)


class ProtocolError(WireError):
    """A line that is not a message of this protocol version."""


@dataclass(frozen=True)
class ForkRequest:
    """Fork a phase child: `python -m dflash_doctor.repro.child ARGV` in `cwd`, with `env`, its output in `log`,
    `path` put in front of its sys.path (a --model child's folder and the user's PYTHONPATH)."""

    ident: int  # the harness's number for it, echoed in the Forked answer
    argv: Tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    log: str
    path: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Ready:
    """The server has made its imports and forks from now on."""

    pid: int


@dataclass(frozen=True)
class Forked:
    ident: int  # the request's
    pid: int  # the child's (it leads a session of its own)


@dataclass(frozen=True)
class Exited:
    pid: int
    status: int  # os.waitstatus_to_exitcode: negative for a signal


ServerMessage = Union[Ready, Forked, Exited]
_KINDS = {Ready: "ready", Forked: "forked", Exited: "exited", ForkRequest: "fork"}


def encode(message: Union[ForkRequest, ServerMessage]) -> str:
    """One line (with its newline) for the other side."""
    body: Dict[str, Any]
    if isinstance(message, ForkRequest):
        body = {"ident": message.ident, "argv": list(message.argv), "env": dict(message.env), "cwd": message.cwd,
                "log": message.log, "path": list(message.path)}
    elif isinstance(message, Forked):
        body = {"ident": message.ident, "pid": message.pid}
    elif isinstance(message, Exited):
        body = {"pid": message.pid, "status": message.status}
    else:
        body = {"pid": message.pid}
    return json.dumps({"version": PROTOCOL_VERSION, "kind": _KINDS[type(message)], **body}) + "\n"


def _message(document: Any) -> Tuple[str, Fields]:
    f = Fields(document, "a warm-start line", ProtocolError)
    f.version(PROTOCOL_VERSION)
    return f.text("kind"), f


def decode_request(line: str) -> ForkRequest:
    """What the harness asked the server (the server's side)."""
    kind, f = _message(load_json(line, MAX_DEPTH, ProtocolError))
    if kind != "fork":
        raise ProtocolError(f"a warm-start request of kind {kind[:20]!r}, not 'fork'")
    env = f.mapping("env")
    if not all(isinstance(value, str) for value in env.values()):
        raise ProtocolError("a fork request's 'env' holds something other than strings")
    return ForkRequest(f.integer("ident"), f.texts("argv"), env, f.text("cwd"), f.text("log"), f.texts("path"))


def decode_message(line: Union[str, bytes]) -> Optional[ServerMessage]:
    """What the server said (the harness's side); None for a line that is not JSON at all."""
    try:
        document = json.loads(line)
    except ValueError:
        return None
    except RecursionError:
        raise ProtocolError("a warm-start line nested too deep to read") from None
    kind, f = _message(check_depth(document, MAX_DEPTH, ProtocolError))
    if kind == "ready":
        return Ready(f.integer("pid"))
    if kind == "forked":
        return Forked(f.integer("ident"), f.integer("pid"))
    if kind == "exited":
        return Exited(f.integer("pid"), f.integer("status"))
    raise ProtocolError(f"a warm-start message of kind {kind[:20]!r}")
