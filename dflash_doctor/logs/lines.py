"""One log line as the rules read it: decoded, with what wraps it taken off (markdown quoting, an ISO time stamp,
a progress bar it was glued to, a logger's record prefix) and the worker its prefix names split from its body.

`WorkerNames` keeps what lines taught about workers: the bytes that tag a worker's lines (to look back for its
last progress line in a sampled block) and the rank a prefixed process ('(Actor pid=N)') said it is.
"""
from __future__ import annotations

import re
from typing import Dict, Optional, Tuple

from dflash_doctor.logs import patterns
from dflash_doctor.rules.logs import UNNAMED

NAME_CACHE = 4096  # decoded names kept per kind: bounded whatever the log
_ROLE_RANK = re.compile(r"\brank=(\d+)")


class WorkerNames:
    def __init__(self) -> None:
        self.tags: Dict[str, bytes] = {}  # the bytes that name a worker on its lines, for looking back
        self.process_ranks: Dict[str, str] = {}  # a prefixed process ('Actor pid=N') -> the rank its lines named
        self.decoded: Dict[bytes, str] = {}  # a progress row's thread bytes -> its name (the fast path)

    def tag(self, worker: str, tag: bytes) -> None:
        self.tags.setdefault(worker, tag)

    def name_rank(self, process: str, rank: str) -> None:
        if process not in self.process_ranks and len(self.process_ranks) < NAME_CACHE:
            self.process_ranks[process] = rank

    def decode(self, thread: bytes) -> str:
        name = self.decoded.get(thread)
        if name is None:
            name = thread.decode()
            if len(self.decoded) < NAME_CACHE:
                self.decoded[thread] = name
                self.tags.setdefault(name, b"[" + thread + b"]")
        return name

    def worker_for(self, worker: str, details: Dict, stream: Optional[str] = None) -> str:
        """A line that names no worker but a rank ('[PG 0 Rank 3]', torchrun's 'local_rank: 3') is that rank's; so
        is one behind a process's prefix (Ray's '(Actor pid=N)', a pdsh host): the rank names the GPU's worker
        (the process stays in the evidence)."""
        rank = details.get("rank", details.get("local_rank"))
        behind_prefix = worker == stream and stream is not None and not stream.startswith("rank")
        if rank is None and behind_prefix and stream in self.process_ranks:
            details["process"] = worker
            return self.process_ranks[stream]  # the process named its rank on an earlier line
        if rank is not None and (worker == UNNAMED or behind_prefix):
            if behind_prefix and len(self.process_ranks) < NAME_CACHE:
                details["process"] = worker
                self.process_ranks[worker] = f"rank{rank}"
            return f"rank{rank}"
        return worker


def unwrap(raw: bytes) -> str:
    """The line's text without markdown quoting, an ISO time stamp or a progress bar glued before it."""
    text = raw.decode("utf-8", "replace").rstrip("\r")
    if text[:1] in ">`*":
        text = patterns.MARKDOWN_LEAD.sub("", text, count=1)
    stamp = patterns.ISO_STAMP.match(text) if text[:1].isdigit() else None
    if stamp is not None:
        text = text[stamp.end():]
    glued = text.find("Exception in thread ")
    if glued < 0:
        glued = text.find("[rank")  # '... 70/60000 [00:10<2:02:41, 8.14it/s][rank1]: Traceback (most ...'
    if glued > 0 and patterns.PROGRESS_BAR_TAIL.search(text, 0, glued):
        text = text[glued:]
    return text


def without_record_prefix(body: str) -> str:
    if body[:1] in "-IWEDC":
        record = patterns.LOGGER_RECORD_PREFIX.match(body)
        if record is not None:
            return body[record.end():]
    return body


def split_prefix(text: str, names: WorkerNames) -> Tuple[Optional[str], str]:
    """(the worker a line's prefix names, the line without it): '[rank1]:', Ray's '(Actor pid=N)' (with a rank
    prefix inside it, the rank), a pdsh host, a compose container; a runner's stream tag names none."""
    prefix = patterns.WORKER_PREFIX.match(text)
    if prefix is None:
        return None, text
    group = prefix.group
    role_rank = _ROLE_RANK.search(group("role") or "")  # vLLM's '(VllmWorker rank=3 pid=9)'
    rank = group("rank") or group("mpirank") or (role_rank.group(1) if role_rank else None)
    stream: Optional[str] = (
        f"rank{rank}" if rank else group("host") or group("container")
        or (f"pid={group('barepid')}" if group("barepid") else None) or group("node") or group("node_")
        or f"{group('proc')}{group('role')} pid={group('pid')}")
    body = text[prefix.end():]
    inner = patterns.WORKER_PREFIX.match(body) if not rank and body[:1] == "[" else None
    if inner is not None and inner.group("rank"):  # '(Worker pid=9) [rank1]:...': the rank is the worker
        if stream is not None:
            names.name_rank(stream, f"rank{inner.group('rank')}")  # its unprefixed lines are that rank's
        stream, body = f"rank{inner.group('rank')}", body[inner.end():]
    elif group("node") or group("node_"):
        return None, body  # a runner's tag ('bench.nolog [stderr] ', 'stderr: ') names no worker
    if stream is not None and stream not in names.tags:
        names.tags[stream] = group(0).rstrip().encode()
    return stream, body


def thread_of(text: str, thread_re: "re.Pattern[str]", default_threads: bool) -> str:
    """The worker a line's text names (thread=NAME, [rankN], a NAME-N token, or the user's --thread-pattern)."""
    if default_threads:
        start = text.find("[")
        while start >= 0:
            match = patterns.BRACKET_THREAD_AT.match(text, start)
            if match:
                return match.group("named") or match.group("rank")
            start = text.find("[", start + 1)
    match = thread_re.search(text)
    if not match:
        tag = patterns.LINE_TAG.match(text) if default_threads and text[:1] == "[" else None
        return tag.group("tag") if tag is not None else UNNAMED
    named = match.groupdict()
    for key in ("thread", "excepthook", "rank", "named"):
        if named.get(key):
            return named[key]
    return next((g for g in match.groups() if g), UNNAMED)
