"""Reading the files a user names by option (--baseline, --config, --from, --log, --repro-json...), bounded.

Every option or argument that names an input is declared once, with `input_option`/`input_argument` and an
`InputSpec` (what it must be, how large it may be, whether `-` means standard input). `commands.common.guarded`
checks each declared value before the command body runs (`preflight`), so a FIFO, a device, a file of the
kernel's pseudo file systems (`/proc/kmsg` blocks on read and reports size 0), a missing file or one over its
cap is one line and exit 2 before any work; tests/robustness reads the same declarations to attack them all.
The values are also noted as the command's inputs (`outputs.note_input`), so no output is ever written over one.

Files read whole (a baseline, a pyproject.toml, a repro result) go through `read_bytes`/`read_text`: opened
without blocking (a path that turned into a FIFO since the check cannot hang), decided by fstat on the open
descriptor, and never read past the cap, so /dev/zero or a sparse 2 GB file cannot fill memory. A cap is raised
for a legitimately huge input with the root option `dflash-doctor --max-input-size SIZE COMMAND ...`.
Files that their reader streams (logs, nvidia-smi CSVs) have no size cap here: the reader bounds lines and rows.
"""
from __future__ import annotations

import errno
import os
import re
import stat
import sys
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

from dflash_doctor.errors import UsageError

MIB = 2**20
SIZE_OPTION = "--max-input-size"
# The pseudo file systems whose "regular" files are kernel interfaces: size 0, endless or blocking reads.
PSEUDO_FILE_SYSTEMS = frozenset({"proc", "sysfs", "debugfs", "tracefs", "securityfs", "configfs", "cgroup",
                                 "cgroup2", "pstore", "bpf", "efivarfs", "fusectl", "binfmt_misc"})


@dataclass(frozen=True)
class InputSpec:
    """What one option's input must be."""

    what: str  # what the file holds, for messages: "a `scan --format json` report"
    max_bytes: Optional[int] = None  # read whole up to this size; None: streamed, its reader bounds it
    stdin: bool = False  # `-` means standard input
    folder: bool = False  # the option names a folder, not a file
    must_exist: bool = True  # False: a folder the command creates (--save DIR)
    # False: the reader itself reports a FIFO or device as a problem in its report (logs FILE), so the
    # check here only refuses what no reader can handle (a missing file, a kernel pseudo-file, a closed stdin).
    regular_only: bool = True


# The caps, one per kind of input. A repro result or a pyproject.toml is a few KiB; a baseline lists every
# finding of a tree, about 1 KiB each, so 64 MiB is some 60,000 findings.
BASELINE = InputSpec("a `scan --format json` report", max_bytes=64 * MIB)
PYPROJECT = InputSpec("a pyproject.toml", max_bytes=1 * MIB)
REPRO_JSON = InputSpec("a `repro --format json` result", max_bytes=16 * MIB)
GPU_CSV = InputSpec("an nvidia-smi --query-gpu CSV", stdin=True)
LOG = InputSpec("a training log", stdin=True)
LOG_ANY_KIND = InputSpec("a training log", stdin=True, regular_only=False)
SOURCE_FOLDER = InputSpec("a folder", folder=True)
SAVE_FOLDER = InputSpec("a folder to save into", folder=True, must_exist=False)

_DECLARED: List[Tuple[Any, InputSpec]] = []  # (typer's OptionInfo/ArgumentInfo, its spec), compared by identity
LIMIT_OVERRIDE: Optional[int] = None  # set by --max-input-size: replaces every cap
STDIN_CLOSED = False  # set by cli.py when the process started with file descriptor 0 closed


def input_option(spec: InputSpec, default: Any, *declarations: str, **kwargs: Any) -> Any:
    """typer.Option for an option that names an input, declared with its spec."""
    import typer

    info = typer.Option(default, *declarations, **kwargs)
    _DECLARED.append((info, spec))
    return info


def input_argument(spec: InputSpec, default: Any, **kwargs: Any) -> Any:
    """typer.Argument for an argument that names an input, declared with its spec."""
    import typer

    info = typer.Argument(default, **kwargs)
    _DECLARED.append((info, spec))
    return info


def spec_of(declared: Any) -> Optional[InputSpec]:
    """The spec an option or argument was declared with (None: it names no input)."""
    return next((spec for info, spec in _DECLARED if info is declared), None)


def cap(spec: InputSpec) -> Optional[int]:
    if spec.max_bytes is None:
        return None
    return LIMIT_OVERRIDE if LIMIT_OVERRIDE is not None else spec.max_bytes


def parse_size(text: str) -> int:
    """`--max-input-size`: bytes, or with a unit (64MiB, 2GB, 512k)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*", text, re.IGNORECASE)
    if not match:
        raise UsageError(f"{SIZE_OPTION} {text!r}: give bytes or a size such as 64MiB or 2GB")
    number, prefix, binary = float(match.group(1)), match.group(2).lower(), match.group(3).lower()
    base = 1024 if binary.startswith("i") else 1000
    size = int(number * base ** " kmgt".index(prefix or " "))
    if size < 1:
        raise UsageError(f"{SIZE_OPTION} must be at least 1 byte")
    return size


def _shown_size(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", MIB), ("KiB", 1024)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} bytes"


def _kind(mode: int) -> str:
    from dflash_doctor.outputs import file_kind

    return file_kind(mode)


_mounts: Optional[Dict[int, str]] = None


def _file_system_types() -> Dict[int, str]:
    """{st_dev: file system type} of this process's mounts (Linux /proc/self/mountinfo; empty elsewhere)."""
    global _mounts
    if _mounts is None:
        _mounts = {}
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    fields = line.split()
                    if " - " not in line or len(fields) < 3:
                        continue
                    major, _, minor = fields[2].partition(":")
                    fs_type = line.split(" - ", 1)[1].split()[0]
                    _mounts[os.makedev(int(major), int(minor))] = fs_type
        except (OSError, ValueError):
            pass
    return _mounts


def pseudo_file_system(info: os.stat_result) -> Optional[str]:
    """The kernel pseudo file system a file lives on (proc, sysfs...), else None."""
    fs_type = _file_system_types().get(info.st_dev)
    return fs_type if fs_type in PSEUDO_FILE_SYSTEMS else None


def _refusal(info: os.stat_result, spec: InputSpec) -> Optional[str]:
    """Why a file of this kind cannot be this input (None: it can)."""
    if spec.folder:
        return None if stat.S_ISDIR(info.st_mode) else f"is {_kind(info.st_mode)}, not a folder"
    pseudo = pseudo_file_system(info)
    if pseudo and not stat.S_ISDIR(info.st_mode):  # no reader can handle one, not even one taking any kind
        return f"is a kernel interface on {pseudo}, not a regular file (it is never read)"
    if not spec.regular_only:
        return None
    if not stat.S_ISREG(info.st_mode):
        hint = "; pipe it to `-` instead" if spec.stdin and stat.S_ISFIFO(info.st_mode) else ""
        return f"is {_kind(info.st_mode)}, not a regular file (it is never read){hint}"
    limit = cap(spec)
    if limit is not None and info.st_size > limit:
        return (f"is {_shown_size(info.st_size)}, over the {_shown_size(limit)} cap for {spec.what} "
                f"(raise it with dflash-doctor {SIZE_OPTION} SIZE)")
    return None


def preflight(path: str, spec: InputSpec, option: str) -> None:
    """Refuse (UsageError, exit 2) a value that cannot be this input; note it as one of the command's inputs."""
    from dflash_doctor.outputs import note_input

    if path == "-" and spec.stdin:
        if STDIN_CLOSED:
            raise UsageError(f"{option} -: standard input is closed; name a file or redirect stdin")
        return
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # nothing there (a file where a folder on the way should be)
        if spec.must_exist:
            raise UsageError(f"{option} {path}: cannot read: no such {'folder' if spec.folder else 'file'}") from None
        return
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot read: {exc.strerror or exc}") from exc
    why = _refusal(info, spec)
    if why:
        raise UsageError(f"{option} {path} {why}")
    note_input(path)


def _open_regular(path: str, spec: InputSpec, option: str) -> int:
    """A read descriptor on `path`, which fstat says is a regular file within the cap; never blocks."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot read: {exc.strerror or exc}") from exc
    try:
        why = _refusal(os.fstat(fd), spec)
    except OSError as exc:
        os.close(fd)
        raise UsageError(f"{option} {path}: cannot read: {exc.strerror or exc}") from exc
    if why:
        os.close(fd)
        raise UsageError(f"{option} {path} {why}")
    return fd


def read_bytes(path: str, spec: InputSpec, option: str) -> bytes:
    """The whole content of a regular file of at most the spec's cap, else one UsageError line (see above)."""
    from dflash_doctor.outputs import note_input

    fd = _open_regular(path, spec, option)
    limit = cap(spec)
    remaining = (limit if limit is not None else sys.maxsize - 1) + 1  # a file growing while read stops at the cap
    chunks = []
    try:
        note_input(path)
        while remaining > 0:
            try:
                chunk = os.read(fd, min(remaining, MIB))
            except BlockingIOError:  # a regular file never says "try again": some kernel stream in disguise
                raise UsageError(f"{option} {path} blocks when read, so it is not a regular file") from None
            except OSError as exc:
                raise UsageError(f"{option} {path}: cannot read: {exc.strerror or exc}") from exc
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    finally:
        os.close(fd)
    if remaining <= 0 and limit is not None:
        raise UsageError(f"{option} {path} grew past the {_shown_size(limit)} cap for {spec.what} while being "
                         f"read (raise it with dflash-doctor {SIZE_OPTION} SIZE)")
    return b"".join(chunks)


def read_text(path: str, spec: InputSpec, option: str) -> str:
    """`read_bytes` decoded as UTF-8 (a BOM is dropped); binary data or another encoding is one line."""
    data = read_bytes(path, spec, option)
    if b"\0" in data[:8192]:
        raise UsageError(f"{option} {path} holds binary data, not {spec.what}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{option} {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                         f"{exc.start}); {spec.what} is UTF-8") from None


def load_json(path: str, spec: InputSpec, option: str) -> Any:
    """The JSON document in `path`; not JSON, or nested deeper than the parser goes, is one line."""
    import json

    text = read_text(path, spec, option)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{option} {path} is not {spec.what}: not JSON ({exc})") from None
    except RecursionError:
        raise UsageError(f"{option} {path} is not {spec.what}: nested too deeply to read") from None


def declared_inputs(command: Any, values: Dict[str, Any]) -> List[Tuple[str, InputSpec, str]]:
    """(option, spec, value) for every declared input a command was given, a list argument once per item."""
    import inspect

    found = []
    for name, parameter in inspect.signature(command).parameters.items():
        spec = spec_of(parameter.default)
        value = values.get(name)
        if spec is None or value is None:
            continue
        declared = [d for d in getattr(parameter.default, "param_decls", ()) or () if d.startswith("--")]
        metavar = (getattr(parameter.default, "metavar", None) or name.upper()).split("|")[0]
        option = declared[0] if declared else metavar  # an argument is named as its help shows it: FILE
        for item in value if isinstance(value, (list, tuple)) else [value]:
            found.append((option, spec, os.fspath(item)))
    return found


def closed_standard_streams() -> FrozenSet[int]:
    """Which of file descriptors 0, 1, 2 the process cannot use: started closed (`>&-`, `<&-`, `2>&-`), or
    open the wrong way (a launcher's script left on 2 read-only, which writes fail on just the same)."""
    closed = set()
    for fd, wanted in ((0, (os.O_RDONLY, os.O_RDWR)), (1, (os.O_WRONLY, os.O_RDWR)), (2, (os.O_WRONLY, os.O_RDWR))):
        try:
            os.fstat(fd)
        except OSError as exc:
            if exc.errno == errno.EBADF:
                closed.add(fd)
            continue
        try:
            import fcntl
        except ImportError:  # Windows: no access mode to read
            continue
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE not in wanted:
            closed.add(fd)
    return frozenset(closed)
