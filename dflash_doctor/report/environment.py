"""The environment section of a bug report: interpreter, platform, versions of the packages that decide the
race, and the environment variables that change torch.compile's behaviour (redacted).

Versions come from package metadata, so collecting them never imports torch (or anything else heavy).
"""
from __future__ import annotations

import os
import platform
import sys
from typing import Callable, Dict, Mapping, Optional, Sequence

from dflash_doctor.report.redact import redact_argv, redact_env

PACKAGES_OF_INTEREST = (
    "torch", "triton", "pytorch-triton", "transformers", "accelerate", "deepspeed", "flash-attn", "numpy",
    "nvidia-ml-py", "psutil", "typer", "rich", "dflash-doctor",
)
# Prefixes of variables that change compile, NCCL, CUDA or Hugging Face behaviour; everything else stays private.
ENV_PREFIXES = (
    "TORCH", "PYTORCH", "TORCHINDUCTOR", "TORCHDYNAMO", "TRITON", "CUDA", "NCCL", "NVIDIA", "OMP_", "MKL_",
    "HF_", "HUGGING", "TRANSFORMERS", "TOKENIZERS", "WANDB", "CUBLAS", "CUDNN", "LOCAL_RANK", "RANK",
    "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYTHON", "VIRTUAL_ENV", "CONDA_PREFIX", "DFLASH",
)


def package_versions(version_of: Optional[Callable[[str], str]] = None) -> Dict[str, Optional[str]]:
    """{distribution: version or None when not installed}."""
    if version_of is None:
        from importlib import metadata

        version_of = metadata.version
    versions: Dict[str, Optional[str]] = {}
    for name in PACKAGES_OF_INTEREST:
        try:
            versions[name] = version_of(name)
        except Exception:  # noqa: BLE001 - PackageNotFoundError, or broken metadata: both mean "unknown"
            versions[name] = None
    return versions


def selected_env(env: Mapping[str, str]) -> Dict[str, str]:
    picked = {k: v for k, v in env.items() if k.upper().startswith(ENV_PREFIXES)}
    return dict(sorted(redact_env(picked).items()))


def command_line(argv: Sequence[str]) -> str:
    """The command as typed (`dflash-doctor report ...`), secret option values masked."""
    import shlex

    from dflash_doctor import TOOL_NAME

    return " ".join([TOOL_NAME] + [shlex.quote(arg) for arg in redact_argv(list(argv[1:]))])


def collect_environment(env: Optional[Mapping[str, str]] = None, version_of=None,
                        argv: Optional[Sequence[str]] = None) -> dict:
    env = os.environ if env is None else env
    return {
        "command": command_line(sys.argv if argv is None else argv),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "packages": package_versions(version_of),
        "env": selected_env(env),
    }
