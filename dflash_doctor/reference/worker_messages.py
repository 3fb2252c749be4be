"""What a rank of `pipeline --workers processes` tells its parent, typed, and the one codec both sides use.

A rank (workers_processes.py `Rank`) says what it is doing (`Phase`), that its set-up is done (`Ready`), its
threads' names (`Threads`), the corpus it wrote (`Corpus`), how its target forward runs (`TargetForward`), a route
that fell back from CUDA IPC (`TransportFallback`), each drafter step (`Step`), the flight recorder's blame
(`Blame`) and how it ended (`Ended`). The transport stays a multiprocessing queue, which pickles what is put on
it; what is put is `encode`'s envelope, a plain tuple (version, sender, kind, fields), never the record object,
so the parent's `decode` sees every field by name and checks it: a message of another version, of a kind this
version does not know, or with a field missing, extra or of the wrong type is a `MessageError` naming the sender
and the reason (the parent then ends the run with that rank failed and the reason as its error), never a
KeyError and never a default. Under torchrun the ranks' final messages are gathered the same way.
"""
from __future__ import annotations

import dataclasses
import enum
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Collection, Dict, List, NoReturn, Optional, Tuple, Type, Union

from dflash_doctor.reference.facts import BlameFacts, WrittenCorpusFacts
from dflash_doctor.reference.results import StepRecord, WorkerOutcome

MESSAGES_VERSION = 1


class MessageKind(str, enum.Enum):
    """The kinds of message a rank sends its parent: the envelope's third item (after version and sender)."""

    PHASE = "phase"
    READY = "ready"
    THREADS = "threads"
    CORPUS = "corpus"
    TARGET_FORWARD = "target-forward"
    TRANSPORT_FALLBACK = "transport-fallback"
    STEP = "step"
    BLAME = "blame"
    ENDED = "ended"


@dataclass(frozen=True)
class Phase:
    """The rank is now doing `text` (building its model, compiling, training, waiting for its peers)."""

    KIND: ClassVar[MessageKind] = MessageKind.PHASE
    text: str


@dataclass(frozen=True)
class Ready:
    """The rank's set-up is done: the parent's stall clock starts when every rank has said so."""

    KIND: ClassVar[MessageKind] = MessageKind.READY


@dataclass(frozen=True)
class Threads:
    """The rank's threads by ident, to name the threads of its faulthandler dumps (they carry idents only)."""

    KIND: ClassVar[MessageKind] = MessageKind.THREADS
    names: Dict[int, str]


@dataclass(frozen=True)
class Corpus:
    """How target-0 wrote the corpus every target shares."""

    KIND: ClassVar[MessageKind] = MessageKind.CORPUS
    facts: WrittenCorpusFacts


@dataclass(frozen=True)
class TargetForward:
    """How a target runs its forward: cuda-graph | eager (with the reason), "compiled, " first when fused."""

    KIND: ClassVar[MessageKind] = MessageKind.TARGET_FORWARD
    mode: str


@dataclass(frozen=True)
class TransportFallback:
    """An IPC route that went through torch.distributed instead, and why."""

    KIND: ClassVar[MessageKind] = MessageKind.TRANSPORT_FALLBACK
    reason: str


@dataclass(frozen=True)
class Step:
    """One drafter step done."""

    KIND: ClassVar[MessageKind] = MessageKind.STEP
    record: StepRecord


@dataclass(frozen=True)
class Blame:
    """The rank's flight recorder's blame for FX errors (each the runtime's own shape)."""

    KIND: ClassVar[MessageKind] = MessageKind.BLAME
    blames: List[BlameFacts]


@dataclass(frozen=True)
class Ended:
    """How the rank ended: its last word before it exits (or kills itself, for --fail-worker)."""

    KIND: ClassVar[MessageKind] = MessageKind.ENDED
    outcome: WorkerOutcome


WorkerMessage = Union[Phase, Ready, Threads, Corpus, TargetForward, TransportFallback, Step, Blame, Ended]
MESSAGE_TYPES: Tuple[Type[Any], ...] = typing.get_args(WorkerMessage)
_BY_KIND: Dict[MessageKind, Type[Any]] = {message.KIND: message for message in MESSAGE_TYPES}
assert set(_BY_KIND) == set(MessageKind), "every kind has one message class and every class its own kind"


@dataclass(frozen=True)
class Received:
    """A message as the parent reads it: which rank sent it, and what it says."""

    sender: str
    message: WorkerMessage


class MessageError(ValueError):
    """What a rank put on the queue is not a message this version reads. `sender` when it could be read."""

    def __init__(self, sender: Optional[str], reason: str) -> None:
        super().__init__(reason)
        self.sender, self.reason = sender, reason

    def __str__(self) -> str:
        return f"{self.sender or 'a rank'} sent a message its parent cannot read: {self.reason}"


Envelope = Tuple[int, str, str, Dict[str, Any]]


def encode(sender: str, message: WorkerMessage) -> Envelope:
    """What the rank `sender` puts on the queue for `message`."""
    fields = {field.name: getattr(message, field.name) for field in dataclasses.fields(message)}
    return MESSAGES_VERSION, sender, message.KIND.value, fields


def _runtime_types(hint: Any) -> Tuple[type, ...]:
    """What an isinstance check of a field declared `hint` takes: a container's own type (its entries are the
    sender's), a TypedDict's dict, each member of a Union."""
    origin = typing.get_origin(hint)
    if origin is Union:
        return tuple(kind for arg in typing.get_args(hint) for kind in _runtime_types(arg))
    if origin is not None:
        return (origin,)
    if hint is type(None):
        return (type(None),)
    if isinstance(hint, type) and issubclass(hint, dict):  # a TypedDict is a dict at run time
        return (dict,)
    return (hint,)


_FIELD_TYPES: Dict[Type[Any], Dict[str, Tuple[type, ...]]] = {
    message: {name: _runtime_types(hint) for name, hint in typing.get_type_hints(message).items()
              if name != "KIND"}
    for message in MESSAGE_TYPES
}


def _fields(sender: str, kind: MessageKind, fields: Any) -> Dict[str, Any]:
    """`fields` checked against the message class of `kind`: exactly its fields, each of its declared type."""
    if not isinstance(fields, dict):
        raise MessageError(sender, f"a {kind.value} message whose fields are a {type(fields).__name__}")
    declared = _FIELD_TYPES[_BY_KIND[kind]]
    missing = sorted(set(declared) - set(fields))
    if missing:
        raise MessageError(sender, f"a {kind.value} message without {', '.join(missing)}")
    extra = sorted(str(name) for name in set(fields) - set(declared))
    if extra:
        raise MessageError(sender, f"a {kind.value} message with fields this version does not know: "
                                   f"{', '.join(extra)[:200]}")
    for name, types in declared.items():
        if not isinstance(fields[name], types):
            raise MessageError(sender, f"a {kind.value} message whose {name} is a {type(fields[name]).__name__}")
    return fields


def decode(raw: object, senders: Optional[Collection[str]] = None) -> Received:
    """The message a rank put on the queue, checked; `senders` (the run's rank names), when given, are the only
    senders taken. Raises MessageError."""
    if not isinstance(raw, tuple) or len(raw) != 4:
        raise MessageError(None, f"not a message envelope: {type(raw).__name__} {str(raw)[:80]}")
    version, sender, word, fields = raw
    if not isinstance(sender, str) or (senders is not None and sender not in senders):
        raise MessageError(None, f"a message from {str(sender)[:40]!r}, not a rank of this run")
    if version != MESSAGES_VERSION:
        raise MessageError(sender, f"a message of version {str(version)[:20]}; this dflash-doctor reads "
                                   f"version {MESSAGES_VERSION}")
    try:
        kind = MessageKind(word)
    except ValueError:
        raise MessageError(sender, f"a message of unknown kind {str(word)[:40]!r}") from None
    return Received(sender, _BY_KIND[kind](**_fields(sender, kind, fields)))


def unhandled(message: NoReturn) -> NoReturn:
    """The end of a reader's branches on the message classes: mypy fails a reader that forgets one (the spelling
    of typing.assert_never, Python 3.11+, for the interpreters before it)."""
    raise AssertionError(f"a message no branch reads: {message!r}")
