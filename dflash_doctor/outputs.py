"""Writing the files a user names (--output, --out, --trace) and the tool's own artifacts, without losing data.

What a write does depends on what the path is when it happens:

- missing, or a regular file: the data goes to a temporary file in the same folder, is flushed and renamed over
  the target, so a reader never sees half a file and a failure leaves the old one as it was (the temporary file
  is removed). An existing file keeps its permission bits; a new one gets 0666 minus the umask, like `>`.
- a symbolic link: the link is followed; its target is replaced as above and the link stays a link.
- a character device (/dev/null, a terminal, /dev/stdout) or a FIFO: written in place, as `>` would; it is never
  replaced by a regular file. A FIFO nobody reads is waited for FIFO_READER_WAIT_S, then the write fails.
- a folder, a socket or a block device: refused.

`check_output` is called when a command's options are parsed, before any long work: it refuses a path that is
one of the command's inputs (same file, even through a link) or one of those kinds, and proves the folder is
writable by creating (and removing) a file in it.

The inputs are the ones a command passes and every file noted with `note_input` (each declared input option,
checked by `inputs.preflight`, and each file `inputs.read_bytes` read), compared by device and inode, so a hard
link to the baseline is the baseline. `atomic_file` checks them again when it writes: a path that became an
input since the options were parsed is refused then, and the report goes where a failed write sends it.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from pathlib import Path
from typing import IO, Dict, Iterable, Iterator, Optional, Tuple, Union

from dflash_doctor.errors import UsageError

PathLike = Union[str, "os.PathLike[str]"]
FIFO_READER_WAIT_S = 10.0
_POLL_S = 0.05
_INPUTS: Dict[Tuple[int, int], str] = {}  # (st_dev, st_ino) -> the path it was named by


def note_input(path: PathLike) -> None:
    """Remember a regular file the command reads, so no output of this process replaces it."""
    try:
        found = os.stat(path)
    except OSError:
        return
    if stat.S_ISREG(found.st_mode):
        _INPUTS.setdefault((found.st_dev, found.st_ino), os.fspath(path))


def _noted_input(found: Optional[os.stat_result]) -> Optional[str]:
    if found is None or not stat.S_ISREG(found.st_mode):
        return None
    return _INPUTS.get((found.st_dev, found.st_ino))


def _stat(path: PathLike) -> Optional[os.stat_result]:
    """The path's (followed) status, None when nothing is there; other errors (a link loop) propagate."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words a user recognises."""
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def written_in_place(mode: int) -> bool:
    """Streams the data flows through rather than files that hold it: never replaced, never renamed over."""
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def refusal(mode: int) -> Optional[str]:
    """Why a path of this kind cannot take a report (None: it can)."""
    if stat.S_ISDIR(mode):
        return "is a folder"
    if stat.S_ISSOCK(mode):
        return "is a socket"
    if stat.S_ISBLK(mode):
        return "is a block device (writing a report there would destroy what it holds)"
    return None


def _same_file(a: PathLike, a_stat: Optional[os.stat_result], b: PathLike) -> bool:
    b_stat = _stat(b)
    if a_stat is not None and b_stat is not None:
        return (a_stat.st_dev, a_stat.st_ino) == (b_stat.st_dev, b_stat.st_ino)
    return os.path.realpath(a) == os.path.realpath(b)


def _nearest_folder(path: Path) -> Path:
    for folder in (path, *path.parents):
        if folder.exists():
            return folder
    return Path(os.sep)


def _read_through(path: PathLike, found: Optional[os.stat_result], source: PathLike,
                  read_suffixes: Tuple[str, ...]) -> Optional[str]:
    """How the command would read `path` through its input `source`, if it would: as the same file, or as a
    file it picks up below the folder `source` (an existing `train.py` under `scan .`)."""
    if _same_file(path, found, source):
        return f"is the same file as {os.fspath(source)}"
    if found is None or not read_suffixes or not os.path.isdir(source):
        return None
    target = os.path.realpath(path)
    if target.endswith(read_suffixes) and target.startswith(os.path.join(os.path.realpath(source), "")):
        return f"is a file this command reads in {os.fspath(source)}"
    return None


def check_output(path: Optional[PathLike], inputs: Iterable[Optional[PathLike]] = (), option: str = "--output",
                 *, read_suffixes: Tuple[str, ...] = ()) -> None:
    """Raise UsageError when `path` cannot take the command's output (see the module docstring); None passes.

    `inputs` are the files and folders the command reads (`-` and None are skipped); `read_suffixes` the kinds
    of file it reads inside a folder, so an existing one there counts as an input too."""
    if path is None:
        return
    shown = os.fspath(path)
    if shown == "-":  # many tools read it as stdout; here it would make a file named '-' in the working folder
        raise UsageError(f"{option} -: name a file (without {option} the output goes to the terminal)")
    try:
        found = _stat(path)
    except OSError as exc:
        raise UsageError(f"{option} {shown}: {exc.strerror or exc}") from exc
    for source in inputs:
        if source is None or os.fspath(source) == "-":
            continue
        how = _read_through(path, found, source, read_suffixes)
        if how:
            raise UsageError(f"{option} {shown} {how}; refusing to overwrite an input (name another file)")
    noted = _noted_input(found)
    if noted is not None:
        raise UsageError(f"{option} {shown} is the same file as {noted}; refusing to overwrite an input "
                         "(name another file)")
    if found is not None:
        why = refusal(found.st_mode)
        if why:
            raise UsageError(f"{option} {shown} {why}")
        if written_in_place(found.st_mode):
            if not os.access(path, os.W_OK):
                raise UsageError(f"{option} {shown} is not writable")
            return
        if not os.access(path, os.W_OK):
            raise UsageError(f"{option} {shown} is read-only")
    target = Path(os.path.realpath(path))
    folder = _nearest_folder(target.parent)
    if not folder.is_dir():
        raise UsageError(f"{option} {shown}: {folder} is not a folder")
    try:
        fd, probe = _create_temporary(folder / ".dflash-doctor-probe")
    except OSError as exc:
        raise UsageError(f"{option} {shown}: cannot write in {folder} ({exc.strerror or exc})") from exc
    os.close(fd)
    os.unlink(probe)


def _open_fifo(path: PathLike, wait_s: float) -> int:
    """A write descriptor on a FIFO once a reader has it open; never blocks past `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() >= deadline:
                if exc.errno == errno.ENXIO:
                    raise OSError(errno.ENXIO, f"no process read the FIFO within {wait_s:g}s") from exc
                raise
            time.sleep(_POLL_S)
            continue
        os.set_blocking(fd, True)
        return fd


@contextlib.contextmanager
def atomic_file(path: PathLike, mode: str = "w", *, encoding: str = "utf-8", errors: str = "backslashreplace",
                fsync: bool = False, fifo_wait_s: float = FIFO_READER_WAIT_S) -> Iterator[IO]:
    """Open `path` for writing by the rules in the module docstring; the file appears only if the block ends
    without an exception. `mode` is "w" (text) or "wb"."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_file writes only, mode 'w' or 'wb', not {mode!r}")
    text = mode == "w"
    found = _stat(path)
    noted = _noted_input(found)
    if noted is not None:
        raise OSError(errno.EEXIST, f"it is the same file as the input {noted}", os.fspath(path))
    if found is not None:
        why = refusal(found.st_mode)
        if why:
            raise OSError(errno.EISDIR if stat.S_ISDIR(found.st_mode) else errno.EINVAL, why, os.fspath(path))
        if written_in_place(found.st_mode):
            fd = (_open_fifo(path, fifo_wait_s) if stat.S_ISFIFO(found.st_mode)
                  else os.open(path, os.O_WRONLY | os.O_NOCTTY))
            with _stream(fd, text, encoding, errors) as stream:
                yield stream
            return
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temporary(target)
    try:
        if found is not None:
            os.fchmod(fd, stat.S_IMODE(found.st_mode))
        with _stream(fd, text, encoding, errors) as stream:
            yield stream
            stream.flush()
            if fsync:
                os.fsync(stream.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _stream(fd: int, text: bool, encoding: str, errors: str) -> IO:
    """A file object over `fd`: text with that encoding and error handler, or binary."""
    return os.fdopen(fd, "w", encoding=encoding, errors=errors) if text else os.fdopen(fd, "wb")


def _create_temporary(target: Path) -> Tuple[int, str]:
    """A new file next to `target`. Not mkstemp: its 0600 would stick to the report, while 0666 here is cut
    by the umask as any redirect's file is (reading the umask would mean setting it, racing other threads)."""
    for _ in range(100):
        tmp = str(target.with_name(f".{target.name}.{os.urandom(4).hex()}.tmp"))
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(target.parent))


def write_atomically(path: PathLike, data: Union[str, bytes], *, fsync: bool = False) -> None:
    """Write `data` (text as UTF-8) to `path` through `atomic_file`."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w", fsync=fsync) as stream:
        stream.write(data)
