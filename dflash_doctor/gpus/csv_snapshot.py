"""nvidia-smi `--query-gpu ... --format=csv[,noheader][,nounits]` snapshots, with or without a header row.

Repeated rows of one GPU (`nvidia-smi ... -l 1 > file`) are samples and are averaged like live NVML samples.
A malformed line becomes a Problem naming its line number; every other line is still read.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence

from dflash_doctor.errors import UsageError
from dflash_doctor.findings import Problem
from dflash_doctor.gpus.readings import GpuReading, ReadingAccumulator

# The seeds' query: nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader
SEED_COLUMNS = ("index", "memory.used", "utilization.gpu")
REQUIRED_COLUMNS = ("index", "memory.used", "utilization.gpu")

_MISSING = {"", "n/a", "[n/a]", "[not supported]", "[unknown error]", "[insufficient permissions]", "[gpu is lost]"}
_NUMBER = re.compile(r"^([-+]?\d+(?:\.\d+)?)\s*([A-Za-z%]*)$")
_MIB_PER = {"": 1.0, "mib": 1.0, "gib": 1024.0, "tib": 1024.0 ** 2, "kib": 1 / 1024, "b": 1 / 1024 ** 2,
            "mb": 1e6 / 2 ** 20, "gb": 1e9 / 2 ** 20, "kb": 1e3 / 2 ** 20}
_UNIT_SUFFIX = re.compile(r"\s*\[[^\]]*\]\s*$")
MAX_GPU_INDEX = 1023  # no host has more; larger indices are garbage, and a range up to them would not fit memory
MAX_GPUS = 1024
MAX_ROWS = 1_000_000  # rows read from one snapshot (nvidia-smi -l 1 for 8 GPUs: over a day of samples)
MAX_PROBLEMS = 20  # malformed lines reported one by one; the rest are counted


class BadValue(ValueError):
    pass


def column_name(raw: str) -> str:
    """'memory.used [MiB]' -> 'memory.used' (nvidia-smi's header adds units in brackets)."""
    return _UNIT_SUFFIX.sub("", raw).strip().lower()


def parse_columns(spec: str) -> tuple:
    columns = tuple(column_name(c) for c in spec.split(",") if c.strip())
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise UsageError(f"--columns {spec!r} lacks {', '.join(missing)} (needed: {', '.join(REQUIRED_COLUMNS)})")
    return columns


def parse_mib(text: str) -> Optional[float]:
    """'74989 MiB' / '74989' / '73.2 GiB' -> MiB; '[N/A]' -> None; anything else -> BadValue."""
    value = text.strip()
    if value.isdecimal():  # `nounits` output, nearly every row of a long `-l 1` log: what _NUMBER would take
        return float(value)
    if value.lower() in _MISSING:
        return None
    match = _NUMBER.match(value)
    if not match or match.group(2).lower() not in _MIB_PER:
        raise BadValue(f"{value!r} is not a memory size")
    if match.group(1).startswith("-"):
        raise BadValue(f"memory {value!r} is negative")
    return float(match.group(1)) * _MIB_PER[match.group(2).lower()]


def parse_percent(text: str) -> Optional[float]:
    value = text.strip()
    if value.isdecimal() and len(value) <= 3:  # `nounits` output (a longer run of digits is past 100 anyway)
        percent = float(value)
        if percent <= 100.0:
            return percent
    if value.lower() in _MISSING:
        return None
    match = _NUMBER.match(value)
    if not match or match.group(2) not in ("", "%"):
        raise BadValue(f"{value!r} is not a percentage")
    percent = float(match.group(1))
    if not 0.0 <= percent <= 100.0:
        raise BadValue(f"utilization {value!r} is outside 0-100 %")
    return percent


def parse_memory_total(text: Optional[str]) -> Optional[float]:
    """--memory-total: '97871' (MiB, as nvidia-smi prints), '141GB', '95.6GiB'."""
    if text is None:
        return None
    try:
        value = parse_mib(text)
    except BadValue:
        value = None
    if value is None or value <= 0:
        raise UsageError(f"--memory-total {text!r}: expected a size like 97871 (MiB), 96GiB or 141GB")
    return value


@dataclass
class CsvSnapshot:
    readings: List[GpuReading]
    problems: List[Problem] = field(default_factory=list)
    columns: tuple = ()
    header: bool = False
    rows: int = 0


class _Positions:
    """Where a row's cells are, by column name: found once, not once a row (a day's `-l 1` log is a million
    rows)."""

    def __init__(self, names: Sequence[str]) -> None:
        position = {name: i for i, name in enumerate(names)}  # a repeated name: its last column, as before
        self.index = position["index"]
        self.utilization = position["utilization.gpu"]
        self.memory_used = position["memory.used"]
        self.memory_total = position.get("memory.total")
        self.name = position.get("name")


def _is_header(cells: Sequence[str]) -> bool:
    return not re.fullmatch(r"\s*\d+\s*", cells[0])


def read_csv_snapshot(lines: Iterable[str], source: str, columns: Optional[Sequence[str]] = None) -> CsvSnapshot:
    """Parse nvidia-smi CSV lines. `columns` names the fields of a headerless file (default: the seeds' three).

    Lines starting with '#' are comments. A header row (first data line whose first cell is not an index) names
    the columns; a later identical header (nvidia-smi -l repeats it) is skipped.
    """
    gpus: Dict[int, ReadingAccumulator] = {}
    problems: List[Problem] = []
    names: Optional[tuple] = None
    header_text: Optional[str] = None
    has_header = False
    rows = 0
    skipped = 0
    at: Optional[_Positions] = None

    def bad_line(subject: str, reason: str) -> None:
        nonlocal skipped
        if len(problems) < MAX_PROBLEMS:
            problems.append(Problem(subject, reason, "the line was skipped"))
        else:
            skipped += 1

    for lineno, raw in enumerate(lines, start=1):
        if rows >= MAX_ROWS:
            problems.append(Problem(source, f"stopped reading at line {lineno:,}: more than {MAX_ROWS:,} rows",
                                    "the GPUs were analysed on the rows before it"))
            break
        text = raw.rstrip("\r\n")
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        cells = [c.strip() for c in text.split(",")]
        if names is None:
            if _is_header(cells):
                names = tuple(column_name(c) for c in cells)
                missing = [c for c in REQUIRED_COLUMNS if c not in names]
                if missing:
                    raise UsageError(f"{source}:{lineno}: header has no {', '.join(missing)} column "
                                     f"(query at least {','.join(REQUIRED_COLUMNS)})")
                header_text, has_header = text.strip(), True
                continue
            if columns:
                names = tuple(columns)
            elif len(cells) == len(SEED_COLUMNS):
                names = SEED_COLUMNS
            else:
                raise UsageError(
                    f"{source}:{lineno}: {len(cells)} fields and no header row; name them with --columns "
                    "(e.g. --columns index,memory.used,memory.total,utilization.gpu)"
                )
        elif has_header and text.strip() == header_text:
            continue
        if at is None:  # the names are fixed from here on
            at = _Positions(names)
        if len(cells) != len(names):
            bad_line(f"{source}:{lineno}", f"{len(cells)} fields where the columns name {len(names)} "
                     f"({','.join(names)})")
            continue
        try:
            cell = cells[at.index]
            if not (cell.isdecimal() and len(cell) <= 4) or int(cell) > MAX_GPU_INDEX:
                raise BadValue(f"index {cell[:20]!r} is not a GPU index (0-{MAX_GPU_INDEX})")
            index = int(cell)
            gpu = gpus.get(index)
            if gpu is None and len(gpus) >= MAX_GPUS:
                raise BadValue(f"more than {MAX_GPUS} GPUs in one snapshot")
            utilization = parse_percent(cells[at.utilization])
            memory_used = parse_mib(cells[at.memory_used])
            memory_total = parse_mib(cells[at.memory_total]) if at.memory_total is not None else None
        except BadValue as exc:
            bad_line(f"{source}:{lineno}", str(exc))
            continue
        rows += 1
        if gpu is None:
            gpu = gpus[index] = ReadingAccumulator(index, line=lineno)
        gpu.add(utilization=utilization, memory_used_mib=memory_used, memory_total_mib=memory_total,
                name=cells[at.name] if at.name is not None else None)
    if skipped:
        problems.append(Problem(source, f"{skipped:,} more malformed lines", "each was skipped"))
    return CsvSnapshot(
        readings=[gpus[i].reading() for i in sorted(gpus)],
        problems=problems,
        columns=names or (),
        header=has_header,
        rows=rows,
    )
