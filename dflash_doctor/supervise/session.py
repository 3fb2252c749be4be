"""What `run` tells every process it starts: a session folder, the config in it, and three environment entries.

The config travels as a file in the session folder (not as arguments: the user's argv is untouched), and the
folder's path travels in DFLASH_DOCTOR_RUN_SESSION, which every descendant inherits with PYTHONPATH.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple

from dflash_doctor.children import PACKAGE_ROOT

SESSION_ENV = "DFLASH_DOCTOR_RUN_SESSION"
ROOT_ENV = "DFLASH_DOCTOR_RUN_ROOT"
BOOTSTRAP_DIR = str(Path(__file__).resolve().parent / "bootstrap")
CONFIG_NAME = "config.json"
RECORD_PREFIX = "proc-"


@dataclass(frozen=True)
class RunConfig:
    hang_after_s: float = 120.0  # the fallback: no event and no CPU use this long, after a compile began
    cycle_confirm_s: float = 1.5  # the same lock cycle in two samples this far apart is a deadlock
    fixes: Tuple[str, ...] = ()  # registry names, each one that applies without a code change

    def write(self, session: Path) -> None:
        (session / CONFIG_NAME).write_text(json.dumps(asdict(self)), encoding="utf-8")

    @classmethod
    def read(cls, session: Path) -> "RunConfig":
        data = json.loads((session / CONFIG_NAME).read_text(encoding="utf-8"))
        return cls(float(data["hang_after_s"]), float(data["cycle_confirm_s"]), tuple(data["fixes"]))


def record_path(session: Path, pid: int) -> Path:
    return session / f"{RECORD_PREFIX}{pid}.json"


def child_environment(session: Path, base: Optional[Mapping[str, str]] = None,
                      cache_dir: Optional[Path] = None) -> Dict[str, str]:
    """The user's environment plus the bootstrap first on PYTHONPATH (the bootstrap takes itself off sys.path
    again, so the user's import path is what it would be without the tool)."""
    env = dict(os.environ if base is None else base)
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = BOOTSTRAP_DIR + (os.pathsep + existing if existing else "")
    env[SESSION_ENV] = str(session)
    env[ROOT_ENV] = PACKAGE_ROOT
    if cache_dir is not None:  # --cache cold: nothing compiled before, the trigger of the incident (docs/races.md)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
        env["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
    return env
