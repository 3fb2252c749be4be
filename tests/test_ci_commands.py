"""The README's test commands are what .ci/run runs, the slow marker splits the suite, and .ci/run fails when
pytest collects nothing (exit 5) instead of passing it as green."""
from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO

CI = REPO / ".ci" / "run"


def _readme_test_block() -> list:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split("**Test it**", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_the_readme_test_commands_are_the_ones_ci_runs():
    install_and_fast, slow = _readme_test_block()
    install, mypy, fast = install_and_fast.split(" && ")
    script = CI.read_text(encoding="utf-8")
    assert install == 'python3 -m pip install -e ".[test]" "torch==2.13.0"' and install in script.splitlines()
    assert mypy in script.splitlines()
    assert fast == "python3 -m pytest -n auto" and "run_pytest -n auto" in script.splitlines()
    assert slow == "python3 -m pytest -n auto -m slow" and "run_pytest -n auto -m slow" in script.splitlines()
    # torch is named pinned wherever the script installs anything
    assert all('"torch==2.13.0"' in line for line in script.splitlines() if "pip install" in line)


def test_a_selection_of_no_tests_fails_ci_instead_of_passing():
    function = re.search(r"^run_pytest\(\) \{.*?^\}", CI.read_text(encoding="utf-8"), flags=re.S | re.M).group(0)
    proc = subprocess.run(["bash", "-c", f"set -euo pipefail\n{function}\nrun_pytest -q -p no:cacheprovider "
                           "-m no_such_marker tests/test_ci_commands.py\necho passed"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "passed" not in proc.stdout.splitlines(), proc.stdout + proc.stderr
    assert "collected no tests" in proc.stderr


def test_the_default_run_leaves_the_slow_tests_to_the_second_command():
    def collected(*args):
        proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                               *args, "tests/repro/test_cli_repro.py"], cwd=REPO, capture_output=True, text=True,
                              timeout=120)
        return {line.split("::")[1].split("[")[0] for line in proc.stdout.splitlines() if "::" in line}

    default, slow = collected(), collected("-m", "slow")
    assert "test_a_natural_run_gives_a_verdict" in slow and "test_a_natural_run_gives_a_verdict" not in default
    assert "test_bad_options_are_one_line_and_exit_2" in default and not default & slow
