"""The environment around the guard: versions, relevant env vars, compile caches, and the live flags.

Versions come from package metadata and the analysed torch's `version.py` (no import). The live flags
(`error_on_nested_fx_trace`, `force_compile_during_fx_trace`, the FX flag's value now) are read from an already
imported torch: this process's when the caller has Dynamo loaded (a trainer calling `run_guards`), else the
probe host's fresh interpreter.
"""
from __future__ import annotations

import getpass
import os
import platform
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Mapping, Optional

CONFIG_FLAGS = ("error_on_nested_fx_trace", "force_compile_during_fx_trace")
CONFIG_DEFAULTS = {"error_on_nested_fx_trace": True, "force_compile_during_fx_trace": False}
ENV_VARS = (
    "TORCH_LOGS", "TORCH_COMPILE_DEBUG", "TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_FORCE_DISABLE_CACHES",
    "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE", "TORCHINDUCTOR_COMPILE_THREADS",
    "TRITON_CACHE_DIR", "TRITON_HOME", "TORCHDYNAMO_DISABLE", "TORCH_COMPILE_DISABLE", "CUDA_VISIBLE_DEVICES",
)
TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu")
# A cache walk stops here and says so: counting a huge cache must not make the command slow.
MAX_CACHE_FILES = 200_000


@dataclass(frozen=True)
class CacheFacts:
    dir: str
    exists: bool
    bytes: int
    entries: int  # regular files below the folder
    truncated: bool = False

    def to_dict(self) -> dict:
        return {"dir": self.dir, "exists": self.exists, "bytes": self.bytes, "entries": self.entries,
                "truncated": self.truncated}


def distribution_version(name: str) -> Optional[str]:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def read_versions(torch_version: Optional[str], cuda: Optional[str], hip: Optional[str],
                  version_of: Callable[[str], Optional[str]] = distribution_version) -> dict:
    triton = next((v for v in map(version_of, TRITON_DISTRIBUTIONS) if v), None)
    return {
        "python": platform.python_version(),
        "torch": torch_version or version_of("torch"),
        **torch_build(cuda, hip),
        "triton": triton,
        "transformers": version_of("transformers"),
    }


def torch_build(cuda: Optional[str], hip: Optional[str]) -> dict:
    """The build a torch tree's version.py names: what `--torch-root` can say about versions without the host."""
    return {"torch_build": f"CUDA {cuda}" if cuda else f"ROCm {hip}" if hip else "CPU", "cuda": cuda, "hip": hip}


def read_env(environ: Mapping[str, str]) -> dict:
    return {name: environ.get(name) for name in ENV_VARS}


def inductor_cache_dir(environ: Mapping[str, str]) -> Path:
    """Where inductor keeps compiled graphs: TORCHINDUCTOR_CACHE_DIR, else <tmp>/torchinductor_<user>."""
    configured = environ.get("TORCHINDUCTOR_CACHE_DIR")
    if configured:
        return Path(configured).expanduser().absolute()
    try:
        user = getpass.getuser()
    except (KeyError, OSError, ImportError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return Path(tempfile.gettempdir()) / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def triton_cache_dir(environ: Mapping[str, str]) -> Path:
    """Triton's own kernel cache: TRITON_CACHE_DIR, else $TRITON_HOME/.triton/cache (home by default).

    Inductor puts the kernels it compiles under <inductor cache>/triton/<device> unless TRITON_CACHE_DIR is set.
    """
    configured = environ.get("TRITON_CACHE_DIR")
    if configured:
        return Path(configured).expanduser().absolute()
    home = environ.get("TRITON_HOME") or str(Path.home())
    return Path(home) / ".triton" / "cache"


def cache_facts(folder: Path, max_files: int = MAX_CACHE_FILES) -> CacheFacts:
    """Size and file count of a cache folder, walking without following links."""
    folder = Path(folder)
    if not folder.is_dir():
        return CacheFacts(str(folder), False, 0, 0)
    total = files = 0
    pending = [str(folder)]
    while pending:
        try:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            files += 1
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
                    if files >= max_files:
                        return CacheFacts(str(folder), True, total, files, truncated=True)
        except OSError:
            continue
    return CacheFacts(str(folder), True, total, files)


def fx_flag_spec(layout) -> Optional[str]:
    """How to read the FX flag on a live torch: `NAME` (module global) or `NAME.ATTR` (thread-local object)."""
    flag = layout.fx_flag
    if flag is None or layout.guard is None:
        return None
    return f"{flag.name}.{flag.attribute}" if flag.attribute else flag.name


@dataclass(frozen=True)
class LiveState:
    """The live flags of an imported torch: this process's, or the probe host's (sent in its document,
    host_document.py)."""

    config: Mapping[str, Optional[bool]]  # each of CONFIG_FLAGS -> its value (None: not read)
    fx_flag_now: Optional[bool]  # the FX flag in the reading thread (None: not read, or no flag known)
    gpu_count: Optional[int]  # None: not read

    @classmethod
    def unread(cls) -> "LiveState":
        return cls({name: None for name in CONFIG_FLAGS}, None, None)


def live_state(torch, fx_flag: Optional[str]) -> LiveState:
    """The config flags, the FX flag's value in the calling thread and the GPU count, from a torch whose Dynamo
    is already imported (the caller's own, or the probe host's)."""
    return LiveState(read_config(torch), read_fx_flag(torch, fx_flag), gpu_count(torch))


def read_config(torch) -> Dict[str, Optional[bool]]:
    dynamo_config = torch._dynamo.config
    return {name: getattr(dynamo_config, name, None) for name in CONFIG_FLAGS}


def read_fx_flag(torch, fx_flag: Optional[str]) -> Optional[bool]:
    """The FX flag's value in the calling thread, read as `fx_flag_spec` names it (None: no spec)."""
    if not fx_flag:
        return None
    name, _, attribute = fx_flag.partition(".")
    holder = getattr(torch.fx._symbolic_trace, name, None)
    flag_now = getattr(holder, attribute, False) if attribute else holder
    if callable(flag_now):  # a ContextVar is read with .get()
        flag_now = flag_now()
    return None if flag_now is None else bool(flag_now)


def gpu_count(torch) -> int:
    """Devices the CUDA/ROCm build sees (0 for a CPU build). It asks the driver, so the probe host calls it only
    after forking its probes; it does not create a CUDA context."""
    built_for_gpu = bool(getattr(torch.version, "cuda", None) or getattr(torch.version, "hip", None))
    return torch.cuda.device_count() if built_for_gpu else 0
