"""The session folder on disk, as every process of a `run` uses it: safe on a shared machine where `run` is root.

The folder's name shows in the temporary folder, and a process can outlive the run (a daemon, a torchrun worker in
a session of its own) with the session's path in its environment. Another user could then re-create a folder of
that name, fill it with a crafted config, and plant links named like the files the tool writes, pointing at files
only root may change. So, before every use:

- the folder is opened without following a link (O_NOFOLLOW | O_DIRECTORY) and checked on the open descriptor: a
  directory, owned by this process's effective user, mode 0700, holding a `token` file whose text equals the secret
  the run put in the environment of its own processes (DFLASH_DOCTOR_RUN_TOKEN) and nowhere else;
- every file is opened relative to that descriptor (no path is looked up twice), without following links, and is
  created exclusively (O_CREAT | O_EXCL): a record is written to a new file of a fresh name, then renamed over the
  old one (rename replaces a link itself, never its target);
- a file read back must be a regular file owned by the same user, at most MAX_READ bytes.

A process that outlives the run finds no folder (the run removed it) or one that fails the checks, and writes
nothing. Only `os` and `stat`, which every interpreter has loaded before it runs a line: the bootstrap imports this
module before the user's code.
"""
import os
import stat

TOKEN_ENV = "DFLASH_DOCTOR_RUN_TOKEN"
TOKEN_NAME = "token"
MAX_READ = 64 * 1024 * 1024  # a record with 20,000 events is a few MB
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a planted FIFO never blocks
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class SessionRefused(OSError):
    """The session folder is gone or is not the run's own (see the module docstring)."""


def _refuse(why: str, path: str) -> "SessionRefused":
    return SessionRefused(f"session folder {path} {why}")


def _read_at(folder_fd: int, name: str, limit: int) -> bytes:
    fd = os.open(name, _READ_FLAGS, dir_fd=folder_fd)
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) or found.st_uid != os.geteuid():
            raise OSError(f"{name} is not a regular file of this user")
        if found.st_size > limit:
            raise OSError(f"{name} holds {found.st_size} bytes, more than {limit}")
        chunks = []
        left = limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_folder(path: str, token: str) -> int:
    """A descriptor on the session folder after the checks of the module docstring; SessionRefused otherwise."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as exc:
        raise _refuse(f"cannot be opened ({exc.strerror})", path) from None
    try:
        found = os.fstat(fd)
        if not stat.S_ISDIR(found.st_mode):
            raise _refuse("is not a folder", path)
        if found.st_uid != os.geteuid():
            raise _refuse(f"belongs to uid {found.st_uid}, not {os.geteuid()}", path)
        if stat.S_IMODE(found.st_mode) != 0o700:
            raise _refuse(f"has mode {stat.S_IMODE(found.st_mode):o}, not 700", path)
        try:
            held = _read_at(fd, TOKEN_NAME, 256)
        except OSError:
            raise _refuse("has no token of this run", path) from None
        if not token or held != token.encode("ascii", "replace"):
            raise _refuse("holds another run's token", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_at(folder_fd: int, name: str, data: bytes, mode: int = 0o600) -> None:
    """A new file `name` holding `data`; FileExistsError if anything (a link too) is there already."""
    fd = os.open(name, _CREATE_FLAGS, mode, dir_fd=folder_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def replace_at(folder_fd: int, name: str, data: bytes) -> None:
    """Replace `name` atomically: a fresh exclusive file, renamed over it (a reader never sees half a record)."""
    temporary = f".{name}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
    create_at(folder_fd, temporary, data)
    try:
        os.replace(temporary, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        try:
            os.unlink(temporary, dir_fd=folder_fd)
        except OSError:
            pass
        raise


def read_at(folder_fd: int, name: str, limit: int = MAX_READ) -> bytes:
    return _read_at(folder_fd, name, limit)


class SessionFolder:
    """The folder as a process of the run sees it: every operation checks it again first (module docstring)."""

    def __init__(self, path: str, token: str) -> None:
        self.path = path
        self.token = token

    @classmethod
    def from_environ(cls, path: str) -> "SessionFolder":
        return cls(path, os.environ.get(TOKEN_ENV, ""))

    def _with_folder(self, act):
        fd = open_folder(self.path, self.token)
        try:
            return act(fd)
        finally:
            os.close(fd)

    def read(self, name: str, limit: int = MAX_READ) -> bytes:
        return self._with_folder(lambda fd: _read_at(fd, name, limit))

    def create(self, name: str, data: bytes) -> None:
        self._with_folder(lambda fd: create_at(fd, name, data))

    def replace(self, name: str, data: bytes) -> None:
        self._with_folder(lambda fd: replace_at(fd, name, data))

    def open_new(self, name: str) -> int:
        """A write descriptor on a new file `name` (the caller closes it): for faulthandler's trace."""
        return self._with_folder(lambda fd: os.open(name, _CREATE_FLAGS, 0o600, dir_fd=fd))
