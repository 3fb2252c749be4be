"""Who a traceback belongs to when no 'Exception in thread' header says it: the logger record before it, a per-GPU
tag on its lines, or its own frames.

- A worker that catches an error and logs it (`logger.exception(...)`, `logging` formats with `%(threadName)s`
  anywhere in the prefix: '%(asctime)s %(threadName)s %(levelname)s %(name)s: %(message)s', '%(levelname)s
  %(asctime)s [%(threadName)s] %(message)s') writes the record line, then the traceback. The thread is named on
  the line above, and it did not die: the error is that thread's, and the log goes on.
- Trainers that tag each GPU's thread ('[gpu0] ...', '[drafter-1] ...') tag every line of its traceback too; the tag
  is the worker (read only in front of a traceback's lines, so progress lines keep their fast path).
- A traceback whose frames start in threading's `_bootstrap_inner` (or an executor's worker) ran in a thread, even
  when its header was not pasted: that is an unknown thread, not the main one.
"""
from __future__ import annotations

import re
from typing import Iterable, Optional, Tuple

UNKNOWN_THREAD = "unknown thread"
# A record's level, as the logging module and the usual formats spell it (the error-ish ones: a caught error).
_LEVEL = re.compile(r"(?:^|[\s\[|:-])(?P<level>ERROR|EXCEPTION|CRITICAL|WARNING|WARN|FATAL)(?=[\s\]|:-])")
# A thread's name as `threading` and executors give them ('drafter-1', 'Thread-3 (run)', 'ThreadPoolExecutor-0_1',
# 'gpu0'), alone or bracketed; never a file:line ('train.py:88') or a logger's dotted name.
_THREAD_TOKEN = re.compile(r"(?:^|[\s\[(|:])(?P<name>(?!MainThread\b)(?:Thread-\d+(?: \(\w+\))?|"
                           r"[A-Za-z][\w-]*?(?:-\d+(?:_\d+)?|_\d+|\d+)))(?=[\s\])|:]|$)")
_TIME = re.compile(r"\d\d:\d\d:\d\d")
PREFIX_CHARS = 120  # the record's prefix: where a format puts %(threadName)s
# '[gpu1] Traceback (most recent call last):', '[drafter-0]   File "x.py", line 3, in f',
# '[gpu1] torch.OutOfMemoryError: ...'
BRACKET_STREAM = re.compile(r"^\[(?P<name>[A-Za-z][\w.-]{0,60})\] ?(?=Traceback \(most|\s+File \"|    \S"
                            r"|(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt)\b)")
_THREAD_FRAMES = ("threading.py", "concurrent/futures/thread.py", "parallel_apply.py")


def logged_by(record: Optional[str]) -> Optional[str]:
    """The thread a logger record names, when the record is an error-level one with a time in its prefix (the line
    before a traceback: that thread caught the error and logged it); None otherwise."""
    if record is None or len(record) < 12:
        return None
    head = record[:PREFIX_CHARS]
    level = _LEVEL.search(head)
    if level is None or (level.start() > 1 and _TIME.search(head) is None):
        return None  # (a level that opens the line, or a time in the prefix: a logger's record)
    # the thread sits in the prefix: before the level, or right after it ('ERROR <time> [NAME] message')
    end = head.find(": ", level.end())
    prefix = head[:max(level.end(), end if end > 0 else level.end() + 80)]
    for match in _THREAD_TOKEN.finditer(prefix):
        return match.group("name")
    return None


def bracket_stream(body: str) -> Tuple[Optional[str], str]:
    """('gpu1', the line without it) for a traceback line behind a '[gpu1] ' tag; (None, body) otherwise."""
    if body[:1] != "[":
        return None, body
    match = BRACKET_STREAM.match(body)
    if match is None:
        return None, body
    return match.group("name"), body[match.end():]


def ran_in_a_thread(files: Iterable[str]) -> bool:
    """Whether a traceback's frames show it ran in a thread (its outermost frames are a thread's bootstrap)."""
    return any(file.replace("\\", "/").endswith(_THREAD_FRAMES) for file in files)
