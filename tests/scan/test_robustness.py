"""The scan never crashes, never runs scanned code, never imports torch; discovery and problems behave."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash_doctor.errors import UsageError
from dflash_doctor.scan import scan_paths, scan_source

SNIPPETS = [
    "from torch.utils.checkpoint import checkpoint as ckpt\n",
    "import torch\n",
    "import threading\n",
    "x = torch.compile(f)\n",
    "ckpt(f, x, use_reentrant=True)\n",
    "threading.Thread(target=g).start()\n",
    "def g():\n    return x(1)\n",
    "class W(threading.Thread):\n    def run(self):\n        g()\n",
    "torch._dynamo.config.error_on_nested_fx_trace = False\n",
    "from torch.nn.attention.flex_attention import flex_attention\nflex_attention(q, k, v)\n",
    "model.gradient_checkpointing_enable(**kw)\n",
    "from . import sibling\n",
    "from .... import far\n",
    "global ckpt\n",
    "lambda: (yield)\n",
    "    \n",
    "(((((\n",
]
_settings = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.timeout(120)
@_settings
@given(st.lists(st.sampled_from(SNIPPETS), max_size=12), st.text(max_size=200))
def test_generated_source_never_crashes(snippets, noise):
    source = "".join(snippets) + noise
    try:
        findings = scan_source(source)
    except ValueError:
        return  # unparsable: scan_paths turns this into a problem
    assert all(f.code.startswith("DFD") for f in findings)


@pytest.mark.timeout(120)
@_settings
@given(st.binary(max_size=400), st.sampled_from([b"", b"checkpoint ", b"import threading\n# Thread\n"]))
def test_random_bytes_never_crash(tmp_path_factory, data, trigger):
    folder = tmp_path_factory.mktemp("bytes")
    (folder / "random.py").write_bytes(trigger + data)
    report = scan_paths([str(folder)], jobs=1)
    assert report.facts["files"] == 1
    assert len(report.problems) <= 1


def test_scanning_never_imports_or_runs_the_code(tmp_path):
    marker = tmp_path / "imported.marker"
    target = tmp_path / "evil.py"
    target.write_text(textwrap.dedent(f"""\
        import pathlib
        pathlib.Path({str(marker)!r}).write_text("imported")
        from torch.utils.checkpoint import checkpoint
        import threading
        checkpoint(print, 1)
        threading.Thread(target=print).start()
    """))
    (tmp_path / "__init__.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('pkg')\n")
    report = scan_paths([str(tmp_path)], jobs=1)
    assert [f.code for f in report.findings] == ["DFD102"]
    assert not marker.exists()


@pytest.mark.timeout(120)
def test_scan_imports_no_torch(tmp_path):
    target = tmp_path / "train.py"
    target.write_text("import torch\nfrom torch.utils.checkpoint import checkpoint\ncheckpoint(f, x)\n")
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dflash_doctor", "scan", str(target)],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 1
    imported = [line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")]
    assert "dflash_doctor.scan.engine" in imported
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")]


def test_deeply_nested_code_is_a_problem_not_a_crash(tmp_path):
    deep = tmp_path / "deep.py"
    header = "from torch.utils.checkpoint import checkpoint\n"
    deep.write_text(header + "checkpoint(f, " + "(" * 300 + "1" + ")" * 300 + ", use_reentrant=False)\n")
    long_chain = tmp_path / "chain.py"
    long_chain.write_text(header + "checkpoint(f, " + " + ".join(["1"] * 100_000) + ", use_reentrant=False)\n")
    report = scan_paths([str(tmp_path)], jobs=1)
    assert report.findings == []
    reasons = {os.path.basename(p.subject): p.reason for p in report.problems}
    assert "deep.py" in reasons
    assert set(reasons) <= {"deep.py", "chain.py"}


def test_files_over_the_cap_are_problems_and_others_go_on(tmp_path):
    (tmp_path / "big.py").write_text("import torch.utils.checkpoint\n" + "x = 1\n" * 1000)
    (tmp_path / "small.py").write_text("from torch.utils.checkpoint import checkpoint\ncheckpoint(f, x)\n")
    (tmp_path / "big_but_irrelevant.py").write_text("x = 1\n" * 1000)
    report = scan_paths([str(tmp_path)], jobs=1, max_bytes=2000)
    assert [os.path.basename(p.subject) for p in report.problems] == ["big.py"]
    assert "over the 2,000-byte cap" in report.problems[0].reason
    assert [(os.path.basename(f.path), f.code) for f in report.findings] == [("small.py", "DFD102")]
    assert report.exit_code() == 5


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads unreadable files")
def test_unreadable_file_is_a_problem(tmp_path):
    locked = tmp_path / "locked.py"
    locked.write_text("checkpoint\n")
    locked.chmod(0)
    try:
        report = scan_paths([str(tmp_path)], jobs=1)
    finally:
        locked.chmod(0o644)
    assert [p.reason.split(":")[0] for p in report.problems] == ["cannot read"]


def test_discovery_skips_real_environments_only_and_lists_every_skip(tmp_path):
    bad = "from torch.utils.checkpoint import checkpoint\ncheckpoint(f, x)\n"
    for folder in (".git", "__pycache__", "node_modules", ".tox", "venv", ".venv", "env", "myenv", "condaenv",
                   "lib/site-packages/pkg", "src", "tests", "build"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "mod.py").write_text(bad)
    (tmp_path / "myenv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "condaenv" / "conda-meta").mkdir()
    (tmp_path / "src" / "notes.txt").write_text(bad)
    report = scan_paths([str(tmp_path)], exclude=["tests/*", "build"], jobs=1)
    # A folder named env/venv is somebody's source unless it is a real environment (pyvenv.cfg, conda-meta).
    assert sorted(os.path.relpath(f.path, tmp_path) for f in report.findings) == [
        os.path.join(name, "mod.py") for name in (".venv", "env", "src", "venv")]
    skipped = {os.path.relpath(s["path"], tmp_path): s["reason"] for s in report.facts["skipped_folders"]}
    assert skipped == {
        ".git": "version control", "__pycache__": "bytecode cache", "node_modules": "JavaScript packages",
        ".tox": "tox environments", "myenv": "virtual environment (pyvenv.cfg)", "condaenv": "conda environment",
        os.path.join("lib", "site-packages"): "installed packages", "build": "excluded",
    }
    assert report.facts["skipped_folders_total"] == len(skipped)
    # Pointing at installed packages scans them.
    inside = scan_paths([str(tmp_path / "lib" / "site-packages")], jobs=1)
    assert len(inside.findings) == 1
    explicit = scan_paths([str(tmp_path / "src" / "notes.txt")], jobs=1)
    assert len(explicit.findings) == 1


def test_select_ignore_and_bad_arguments(tmp_path):
    (tmp_path / "a.py").write_text(
        "import torch._dynamo\nfrom torch.utils.checkpoint import checkpoint\ncheckpoint(f, x)\n"
        "torch._dynamo.config.error_on_nested_fx_trace = False\n"
    )
    assert {f.code for f in scan_paths([str(tmp_path)], jobs=1).findings} == {"DFD102", "DFD301"}
    assert {f.code for f in scan_paths([str(tmp_path)], select="DFD1", jobs=1).findings} == {"DFD102"}
    assert {f.code for f in scan_paths([str(tmp_path)], ignore="nested-fx-trace-silenced", jobs=1).findings} == {
        "DFD102"}
    only_config = scan_paths([str(tmp_path)], select=["DFD301"], jobs=1)
    assert only_config.facts["rule_counts"] == {"DFD301": 1}
    with pytest.raises(UsageError):
        scan_paths([str(tmp_path)], select="DFD7")
    with pytest.raises(UsageError):
        scan_paths([str(tmp_path / "missing")])
    with pytest.raises(UsageError):
        scan_paths([str(tmp_path)], jobs=0)
