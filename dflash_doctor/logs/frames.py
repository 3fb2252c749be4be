"""One frame type for every stack the log reader parses, in one order.

Python prints a traceback outermost first ('most recent call last'); py-spy, faulthandler, gdb and pystack print
a thread's stack innermost first. Both parsers store `Stack`: outermost first, innermost last, the order of a
traceback and of dflash_doctor.runtime.stacks.ThreadStack, so `innermost` means the same thing everywhere.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple


class Frame(NamedTuple):
    file: str
    line: int
    function: str

    def where(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


class Stack(NamedTuple):
    frames: Tuple[Frame, ...]  # outermost first, innermost last

    @property
    def innermost(self) -> Optional[Frame]:
        return self.frames[-1] if self.frames else None
