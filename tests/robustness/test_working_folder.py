"""No code runs from the working folder: a `torch.py` (or `typer.py`...) planted where a user, or a CI job on a
pull request, runs dflash-doctor is never imported, by the CLI itself or by any child it starts."""
from __future__ import annotations

import pytest

from tests.robustness.harness import plant, run, run_until_a_child_has_torch

# Each command that imports torch or starts a child, with the least work that still gets there.
TORCH_COMMANDS = [
    pytest.param(["guards", "--timeout", "60"], id="guards"),
    pytest.param(["check", "train.py", "--timeout", "60"], id="check"),
    pytest.param(["repro", "--mode", "forced", "--device", "cpu", "--threads", "2", "--steps", "1",
                  "--timeout", "120", "--hang-after", "60"], id="repro-forced-cpu"),
    pytest.param(["pipeline", "--device", "cpu", "--preset", "tiny", "--steps", "2"], id="pipeline-threads",
                 marks=pytest.mark.slow),  # (end to end: a real training run; guards, check and repro stay)
    pytest.param(["pipeline", "--device", "cpu", "--preset", "tiny", "--steps", "2", "--workers", "processes"],
                 id="pipeline-processes", marks=pytest.mark.slow),
]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("args", TORCH_COMMANDS)
def test_a_planted_torch_is_never_imported(tmp_path, args):
    marker = plant(tmp_path)
    (tmp_path / "train.py").write_text("x = 1\n", encoding="utf-8")
    code, child_has_torch = run_until_a_child_has_torch(args, tmp_path, timeout=120)
    assert not marker.exists(), marker.read_text()
    # Stopped early only once a child had loaded the real torch; otherwise the command ran to its end.
    assert child_has_torch or code is not None


@pytest.mark.parametrize("args", [["--help"], ["explain", "DFD201"], ["scan", "train.py"],
                                  ["report", "train.py", "--no-probes"]])
def test_the_cli_itself_never_imports_from_the_working_folder(tmp_path, args):
    marker = plant(tmp_path)
    (tmp_path / "train.py").write_text("x = 1\n", encoding="utf-8")
    result = run(*args, cwd=tmp_path, timeout=60)
    assert not marker.exists(), marker.read_text()
    assert result.returncode in (0, 1, 4), result


# Modules multiprocessing's own helpers import while they start (`python -c` children: the resource tracker,
# spawn's bootstrap) that the interpreter has not loaded yet: a file of that name first on their path runs.
HELPER_IMPORTS = ("selectors", "pickle", "threading", "socket")
PIPELINE_PROCESSES = ["pipeline", "--device", "cpu", "--preset", "tiny", "--steps", "2", "--workers", "processes"]


@pytest.mark.timeout(150)
def test_multiprocessing_helpers_never_import_from_the_working_folder(tmp_path):
    marker = plant(tmp_path, HELPER_IMPORTS)
    code, child_has_torch = run_until_a_child_has_torch(PIPELINE_PROCESSES, tmp_path, timeout=120)
    assert not marker.exists(), marker.read_text()
    assert child_has_torch or code == 0


@pytest.mark.timeout(150)
@pytest.mark.parametrize("args", [PIPELINE_PROCESSES, ["guards", "--timeout", "60"]], ids=["pipeline", "guards"])
def test_a_relative_pythonpath_entry_never_reaches_a_child(tmp_path, args):
    """PYTHONPATH=REPO:lib (lib relative to the working folder): neither the CLI once started nor any child
    it starts, by subprocess or by multiprocessing, imports from lib. (The interpreter itself honours the entry
    while it starts, before any code of ours runs: threading, which site loads, is left out here.)"""
    lib = tmp_path / "lib"
    lib.mkdir()
    marker = plant(lib, ("selectors", "pickle", "socket", "torch"))
    code, child_has_torch = run_until_a_child_has_torch(args, tmp_path, timeout=120, extra_path="lib")
    assert not marker.exists(), marker.read_text()
    assert child_has_torch or code is not None
