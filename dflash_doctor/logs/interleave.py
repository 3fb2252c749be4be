"""Lines that several dying threads wrote into at once, cut back into the lines each thread meant to write.

CPython's threading.excepthook writes a thread's header in pieces ('Exception in thread ', the name, ':\\n') and
the traceback module writes a frame's indentation, source line and caret line as separate writes; threads dying
together interleave at any of those writes. Seen on torch 2.13.0+cpu, Python 3.11.7, three threads killed at one
barrier (fixtures/logs/programs/three_deaths.py, 221 runs; docs/races.md, "What logs reads from threads"):

    Exception in thread Exception in thread drafter-1:      two headers, the first one's name comes later
    drafter-2    self.run()                                  ... glued to another thread's source line
    drafter-0drafter-2:                                      two late names on one line
    Exception in thread worker-2worker-1Exception in thread worker-0:
    :                                                        a late name's colon, alone
               ^^^^^^^^^^^^^^^^^^^^^Exception in thread drafter-1:     a caret line cut by a header
    NameError: ^^^^^module is not installed as a submodule^^           carets inside an exception line
    self.run()Traceback (most recent call last):             a source line cut from its indentation

`untangle` returns the logical lines of one physical line, given how many headers still wait for their names. It is
only called for a line of a stream that has a traceback open or waiting, or that holds a glue mark, so the common
line costs one substring test.
"""
from __future__ import annotations

import re
from typing import List, Tuple

HEADER = "Exception in thread "
_TRACEBACK = "Traceback (most recent call last):"
# Decoration runs of Python 3.11+'s caret lines ('^^^^', '~~~^^^'): they carry nothing the reader uses.
_CARETS = re.compile(r"[~^]*\^[~^]*")
# Where a piece another thread wrote may start inside a line.
_GLUE = re.compile(r"(?P<header>Exception in thread )|(?P<traceback>Traceback \(most recent call last\):)"
                   r"|(?P<frame>  File \")")
# A thread's name as threading names them ('drafter-1', 'Thread-3 (worker)', 'ThreadPoolExecutor-0_1').
_NAME = re.compile(r"[^\s:()]{1,200}(?: \([^\s()]{1,100}\))?")
_KEYWORDS = frozenset(("else", "try", "finally"))  # source lines that end in ':' like a name does
_GLUED_NAMES = re.compile(r"(?<=\d)(?=[A-Za-z_])")  # 'drafter-0drafter-2': a name ends in its number
_NAME_THEN_SOURCE = re.compile(r"^(?P<name>[^\s:()]{1,200})(?P<rest>    \S.*)$")
# '    self.run()drafter-1drafter-2:': late names written after another thread's source line, before its newline
# (their colon may come later when another write is glued on after them)
_NAMES_AFTER_SOURCE = re.compile(r"(?<=[)\]'\"])(?P<names>(?:[A-Za-z_][\w.]*-\d+)+)(?P<colon>:?)\s*$")


def has_glue(text: str) -> bool:
    """Whether a line may hold pieces of several threads' writes (the cheap test before `untangle`)."""
    return ("^" in text or HEADER in text or "Traceback (most" in text[1:] or '  File "' in text[1:]
            or text.strip() == ":")


def _without_carets(text: str) -> str:
    """The line without caret runs glued to other text; a caret line alone stays as it is."""
    if not text.strip(" ~^") or "^" not in text:
        return text
    stripped = _CARETS.sub("", text)
    rest = stripped.lstrip(" ")
    if rest.startswith(("File \"",)):
        return "  " + rest
    if rest.startswith((HEADER, "Traceback (most")) or not text[:1].isspace():
        return rest
    return stripped


def _pieces(text: str) -> List[str]:
    """The line cut before each header, 'Traceback' line or frame that does not start it."""
    # (a mark after a space is text of its own line: 'C++ Traceback (most ...', a logger's 'Unhandled Exception in
    # thread X: ...'; a write of another thread is glued: 'drafter-0Traceback', '^^^^  File', 'Exception in thread
    # Exception in thread')
    cuts = [m.start() for m in _GLUE.finditer(text)
            if m.start() > 0 and (m.group("frame") or not text[m.start() - 1].isspace() or text[:m.start()].endswith(
                HEADER))] + [len(text)]
    pieces, start = [], 0
    for cut in cuts:
        pieces.append(text[start:cut])
        start = cut
    return [piece for piece in pieces if piece]


def _names(fragment: str, wanted: int) -> List[str]:
    """Late names written together ('drafter-0drafter-2'): split where a name's number ends, when that gives as
    many names as headers wait for."""
    if wanted > 1:
        parts = [p for p in _GLUED_NAMES.split(fragment) if p]
        if len(parts) <= wanted and all(_NAME.fullmatch(p) for p in parts):
            return parts
    return [fragment]


def untangle(text: str, late: int) -> Tuple[List[str], int]:
    """(the logical lines of `text`, headers still waiting for their names after it). Every header comes back
    whole ('Exception in thread NAME:'), its name found wherever it was written."""
    uncareted = _without_carets(text)
    if late and uncareted is not text and _NAME.fullmatch(uncareted.strip()):
        return [f"{HEADER}{uncareted.strip()}:"], late - 1  # '    ~~~^^^drafter-0': a late name after carets
    text = uncareted
    if text[:1].isspace() and text.lstrip().startswith(HEADER):
        text = text.lstrip()  # a caret line's indentation, then a header: the carets came later
    if text.strip() == ":":
        return [], late  # a late name's colon: the name was read already
    alone = text.strip()
    if late and text[:1].isspace() and alone.endswith(":") and _NAME.fullmatch(alone[:-1]) \
            and alone[:-1] not in _KEYWORDS:
        return [f"{HEADER}{alone}"], late - 1  # '        drafter-2:': a late name after another's indentation
    if text.endswith(": :") and late == 0:
        text = text[:-2]  # 'IndexError: :': a late name's colon cut the exception line (its message follows)
    pieces = _pieces(text)
    lines: List[str] = []
    for index, piece in enumerate(pieces):
        if piece.startswith(HEADER):
            rest = piece[len(HEADER):]
            tail = _NAMES_AFTER_SOURCE.search(rest) if rest.rstrip().endswith(":") else None
            if rest[:1].isspace() and rest.rstrip().endswith(":") and _NAME.fullmatch(rest.strip()[:-1]):
                lines.append(f"{HEADER}{rest.strip()}")  # 'Exception in thread     drafter-0:': another's indentation
            elif tail is not None and not _NAME.fullmatch(rest.strip()[:-1]):
                # 'Exception in thread     self.run()drafter-1:': another's source line between this header and
                # its name (the names of earlier headers may be glued there too)
                names = _names(tail.group("names"), late + 1)
                late -= len(names) - 1
                lines += ["    " + rest[:tail.start()].strip()] + [f"{HEADER}{name}:" for name in names]
            elif not rest.strip() or rest[:1].isspace():
                late += 1  # its name comes in a later piece ('Exception in thread     lin(x)': another's source)
                if rest.strip():
                    lines.append(rest)
            elif rest.rstrip().endswith(":"):
                names = _names(rest.rstrip()[:-1], late + 1)  # 'Exception in thread drafter-0drafter-2:'
                late -= len(names) - 1
                lines += [f"{HEADER}{name}:" for name in names]
            elif not _NAME.fullmatch(rest.strip()) and not any(c.isspace() for c in rest.strip()):
                late += 1  # '    Exception in thread self.run()': another's source line, its indentation written first
                lines.append("    " + rest.strip())
            elif not _NAME.fullmatch(rest.strip()):
                lines.append(piece)  # not a header of Python's ('Exception in thread "main" java.lang...')
            else:  # 'Exception in thread worker-2worker-1': this header's name and earlier ones', no colon yet
                names = _names(rest.strip(), late + 1)
                late += 1 - len(names)
                lines += [f"{HEADER}{name}:" for name in names]
            continue
        if index == 0 and late and not piece[:1].isspace():
            head = piece.rstrip()
            bare = head[:-1] if head.endswith(":") else head
            glued = _NAME_THEN_SOURCE.match(piece)
            if _NAME.fullmatch(bare) and (head.endswith(":") or len(pieces) > 1):
                names = _names(bare, late)  # 'drafter-2:', 'drafter-0drafter-2:', 'drafter-0Traceback (most ...'
                late -= len(names)
                lines += [f"{HEADER}{name}:" for name in names]
                continue
            if glued is not None:  # 'drafter-2    self.run()'
                late -= 1
                lines += [f"{HEADER}{glued.group('name')}:", glued.group("rest")]
                continue
        tail = _NAMES_AFTER_SOURCE.search(piece) if late and piece[:1].isspace() else None
        # without its colon only where another write was glued on next ('...kwargs)drafter-1Traceback (most ...'):
        # the colon comes later, alone or on a caret line
        if tail is not None and (tail.group("colon") or index + 1 < len(pieces)):
            names = _names(tail.group("names"), late)
            late -= len(names)
            lines += [piece[:tail.start()]] + [f"{HEADER}{name}:" for name in names]
            continue
        if index == 0 and len(pieces) > 1 and not piece[:1].isspace() and piece[:1] != ":":
            lines.append("    " + piece)  # 'self.run()Traceback (most ...': its indentation was written alone
            continue
        lines.append(piece)
    return lines, max(0, late)
