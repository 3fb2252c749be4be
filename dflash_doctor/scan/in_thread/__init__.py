"""The in-thread checks, one module per rule: importing this package imports every module in it, and each
registers its check with `scan.thread_reach.in_thread` (nothing else to edit to add one)."""
from __future__ import annotations

import importlib
import pkgutil
from typing import Tuple, Type

from dflash_doctor.scan.file_check import FileCheck
from dflash_doctor.scan.thread_reach import IN_THREAD_CHECKS

for _module in sorted(info.name for info in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")

# the FileChecks the in-thread checks collect with, for analysis.py's CHECK_CLASSES
COLLECTORS: Tuple[Type[FileCheck], ...] = tuple(dict.fromkeys(
    collector for code in sorted(IN_THREAD_CHECKS) for collector in IN_THREAD_CHECKS[code].collectors))
