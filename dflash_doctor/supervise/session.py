"""What `run` tells every process it starts: a session folder, the config in it, and four environment entries.

The config travels as a file in the session folder (not as arguments: the user's argv is untouched), and the
folder's path travels in DFLASH_DOCTOR_RUN_SESSION, which every descendant inherits with PYTHONPATH, beside the
run's secret in DFLASH_DOCTOR_RUN_TOKEN (sessionfs.py: why, and how the folder is checked before every use).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from dflash_doctor.children import PACKAGE_ROOT
from dflash_doctor.supervise import sessionfs
from dflash_doctor.supervise.sessionfs import TOKEN_ENV, TOKEN_NAME, SessionFolder

SESSION_ENV = "DFLASH_DOCTOR_RUN_SESSION"
ROOT_ENV = "DFLASH_DOCTOR_RUN_ROOT"
BOOTSTRAP_DIR = str(Path(__file__).resolve().parent / "bootstrap")
CONFIG_NAME = "config.json"
RECORD_PREFIX = "proc-"
BOOTSTRAP_ERROR_PREFIX = "bootstrap-error-"  # one file per process, created exclusively
FAULT_PREFIX = "fault-"  # faulthandler's trace of a process that crashed (SIGSEGV, SIGABRT, ...)


@dataclass(frozen=True)
class RunConfig:
    hang_after_s: float = 120.0  # the fallback: no event and no CPU use this long, after a compile began
    cycle_confirm_s: float = 1.5  # the same lock cycle in two samples this far apart is a deadlock
    fixes: Tuple[str, ...] = ()  # registry names, each one that applies without a code change
    amplifiers: Tuple[str, ...] = ()  # vocabularies.Amplifier values (run --amplify; supervise/amplifiers.py)

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode("utf-8")

    @classmethod
    def decode(cls, data: bytes) -> "RunConfig":
        raw = json.loads(data)
        return cls(float(raw["hang_after_s"]), float(raw["cycle_confirm_s"]), tuple(str(f) for f in raw["fixes"]),
                   tuple(str(a) for a in raw["amplifiers"]))

    def write(self, session: Path) -> None:
        """For tests and benchmarks that build a folder by hand (a real run uses Session.create)."""
        (session / CONFIG_NAME).write_bytes(self.encode())

    @classmethod
    def read(cls, folder: SessionFolder) -> "RunConfig":
        return cls.decode(folder.read(CONFIG_NAME, 1 << 16))


def record_name(pid: int) -> str:
    return f"{RECORD_PREFIX}{pid}.json"


class Session:
    """The supervisor's side: the folder it made (mode 0700, in the temporary folder), its token, and a
    descriptor on it kept for the whole trial, through which every record is read."""

    def __init__(self, path: Path, token: str, fd: int) -> None:
        self.path, self.token, self.fd = path, token, fd

    @classmethod
    def create(cls, config: RunConfig) -> "Session":
        import secrets
        import shutil
        import tempfile

        path = Path(tempfile.mkdtemp(prefix="dflash-doctor-run-"))  # 0700, a fresh name
        token = secrets.token_hex(16)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            sessionfs.create_at(fd, TOKEN_NAME, token.encode("ascii"))
            sessionfs.create_at(fd, CONFIG_NAME, config.encode())
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return cls(path, token, fd)

    def names(self, prefix: str) -> List[str]:
        try:
            return sorted(name for name in os.listdir(self.fd) if name.startswith(prefix))
        except OSError:
            return []

    def read(self, name: str, limit: int = sessionfs.MAX_READ) -> bytes:
        return sessionfs.read_at(self.fd, name, limit)

    def stamp(self, name: str) -> Optional[int]:
        """The file's change time in ns (without following a link), None when it is gone."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mtime_ns
        except OSError:
            return None

    def close(self, remove: bool) -> None:
        import shutil

        try:
            os.close(self.fd)
        except OSError:
            pass
        if remove:
            shutil.rmtree(self.path, ignore_errors=True)


def child_environment(session: Path, base: Optional[Mapping[str, str]] = None,
                      cache_dir: Optional[Path] = None, token: str = "") -> Dict[str, str]:
    """The user's environment plus the bootstrap first on PYTHONPATH (the bootstrap takes itself off sys.path
    again, so the user's import path is what it would be without the tool)."""
    from dflash_doctor.children import user_environ

    # The user's, not this process's: the CLI's own environment is cleaned for its helpers (PYTHONSAFEPATH would
    # keep `python train.py` from importing modules beside train.py)
    env = dict(user_environ() if base is None else base)
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = BOOTSTRAP_DIR + (os.pathsep + existing if existing else "")
    env[SESSION_ENV] = str(session)
    env[ROOT_ENV] = PACKAGE_ROOT
    env[TOKEN_ENV] = token
    if cache_dir is not None:  # --cache cold: nothing compiled before, the trigger of the incident (docs/races.md)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
        env["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
    return env
