"""Threads racing on a compiled function's first call show as recompiles, not errors: `run` names them (real
torch on the CPU, real compiles, 32 real threads)."""
from __future__ import annotations

import json
import sys

import pytest

from tests.run.helpers import program


@pytest.mark.slow  # 32 threads each compiling on a shared 2-core machine: about 40 s
@pytest.mark.timeout(400)
def test_32_threads_making_the_first_call_of_one_compiled_model_are_named(cli, tmp_path):
    out = tmp_path / "run.json"
    proc = cli("run", "-f", "json", "-o", out, "--", sys.executable, program("first_call_storm.py"), timeout=380)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "answered 32 requests"
    findings = json.loads(out.read_text())["findings"]
    finding, = [f for f in findings if f["code"] == "DFD908"]
    evidence = finding["evidence"]
    assert len(evidence["compilers"]) >= 2 and all(name.startswith("request-") for name in evidence["threads"])
    assert evidence["guards_passed"] >= 1 or evidence["limit_hit_in"]
    assert finding["path"].endswith("first_call_storm.py")
    source = open(program("first_call_storm.py")).read().splitlines()
    assert "classifier(features)" in source[finding["line"] - 1]  # the user's call that compiled
