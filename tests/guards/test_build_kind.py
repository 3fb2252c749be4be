"""Which isolation the probes get depends on the torch build, read from its version.py without importing it."""
from __future__ import annotations

import pytest

from dflash_doctor.guards.torch_sources import installed_torch_root, is_accelerator_build


@pytest.mark.parametrize(
    "text, expected",
    [
        ("__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n", True),
        ("cuda = None\nhip: Optional[str] = '6.2.41133'\n", True),
        ("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\nhip: Optional[str] = None\n", False),
    ],
)
def test_build_kind_from_version_py(tmp_path, text, expected):
    (tmp_path / "version.py").write_text(text)
    assert is_accelerator_build(tmp_path) is expected


def test_missing_version_py_is_not_an_accelerator_build(tmp_path):
    assert is_accelerator_build(tmp_path) is False
    assert is_accelerator_build(None) is False


def test_the_installed_cpu_torch_is_recognised():
    import torch

    built_for_gpu = torch.version.cuda is not None or torch.version.hip is not None
    assert is_accelerator_build(installed_torch_root()) is built_for_gpu
