"""benchmarks/speed_ratios.py says why a row has no figure, in one line, and never waits past a child's bound."""
from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "speed_ratios.py"


@pytest.fixture(scope="module")
def speed():
    spec = importlib.util.spec_from_file_location("speed_ratios", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["speed_ratios"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("speed_ratios", None)


@pytest.mark.timeout(30)
def test_a_child_past_its_timeout_is_killed_and_named(speed):
    began = time.monotonic()
    with pytest.raises(speed.ChildFailed) as caught:
        speed.run_child([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=1)
    assert time.monotonic() - began < 10
    assert str(caught.value) == "python3 -c 'import time; time.sleep(60)': timed out after 1 s and was killed"


@pytest.mark.timeout(30)
def test_a_failing_child_gives_its_exit_and_last_stderr_line(speed):
    with pytest.raises(speed.ChildFailed) as caught:
        speed.run_child([sys.executable, "-c", "import sys; sys.stderr.write('one\\nno torch here\\n'); sys.exit(3)"],
                        timeout_s=20)
    assert str(caught.value).endswith(": exit 3: no torch here")


def test_a_spent_budget_runs_nothing_and_says_so(speed):
    limits = speed.Limits(scale=1.0, budget_s=12.0)
    with pytest.raises(speed.ChildFailed, match=r"^not run: 1\d\.\d s of --budget-s 12 left, 15 s needed$"):
        limits["guards"]
    assert speed.Limits(scale=0.5, budget_s=None)["matrix"] == 900.0
    assert speed.Limits(scale=1.0, budget_s=1000.0)["import"] == 120.0


def test_a_row_is_met_missed_or_not_measured(speed):
    Row = speed.Row
    assert Row("guards wall", 3.0, "import", 2.6, 1.2).status == "met"
    assert Row("guards wall", 3.2, "import", 2.6, 1.2).status == "MISSED"
    assert Row("repro", 5.0, "cold compile", None, 2.0).status == "NOT MEASURED (no floor)"
    assert Row("repro", None, "-", None, None, error="timed out").status == "NOT MEASURED"
    assert Row("repro", 5.0, "cold compile, whole process", 20.0, None).status == "info"


@pytest.mark.parametrize("argv, message", [
    (["--only", "guards,bogus"], "--only: unknown row(s) bogus; choose from guards, repro, matrix"),
    (["--repeat", "0"], "--repeat must be >= 1, --timeout-scale and --budget-s > 0"),
])
def test_bad_options_are_one_line_and_exit_2(speed, capsys, argv, message):
    with pytest.raises(SystemExit) as caught:
        speed.main(argv)
    assert caught.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"benchmarks/speed_ratios.py: error: {message}"
