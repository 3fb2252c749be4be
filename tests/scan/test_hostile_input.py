"""Hostile trees: only regular files are read; FIFOs, devices, sockets and unlistable folders are problems
(exit bit 4) named as such, never a hang or an unbounded read; CR-only sources scan like any other."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from dflash_doctor.errors import UsageError
from dflash_doctor.rules.scan import SCAN_RULES
from dflash_doctor.scan import scan_paths

BAD = "from torch.utils.checkpoint import checkpoint\ncheckpoint(f, x)\n"
posix_only = pytest.mark.skipif(os.name != "posix", reason="FIFOs, /dev/zero and sockets are POSIX")


def reasons(report) -> dict:
    return {os.path.basename(p.subject): p.reason for p in report.problems}


@posix_only
@pytest.mark.timeout(60)
def test_fifo_device_link_and_socket_are_problems_not_hangs(tmp_path):
    (tmp_path / "real.py").write_text(BAD)
    os.mkfifo(tmp_path / "pipe.py")  # nobody writes to it: opening it for reading would block forever
    os.symlink("/dev/zero", tmp_path / "z.py")  # reading it would never end
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(tmp_path / "sock.py"))
        report = scan_paths([str(tmp_path)], jobs=1)
    finally:
        server.close()
    assert reasons(report) == {
        "pipe.py": "not read: a FIFO (named pipe)",
        "z.py": "not read: a character device",
        "sock.py": "not read: a socket",
    }
    assert [(os.path.basename(f.path), f.code) for f in report.findings] == [("real.py", "DFD102")]
    assert report.exit_code() == 5


@posix_only
@pytest.mark.timeout(120)
def test_cli_on_a_fifo_named_explicitly_exits_4(cli, tmp_path):
    os.mkfifo(tmp_path / "train.py")
    run = cli("scan", tmp_path / "train.py", "--format", "json", timeout=60)
    assert run.returncode == 4, run.stderr
    document = json.loads(run.stdout)
    assert document["problems"] == [{
        "subject": str(tmp_path / "train.py"), "reason": "not read: a FIFO (named pipe)",
        "hint": "only regular files are scanned; exclude it with --exclude",
    }]


def test_files_over_the_read_cap_are_not_read(tmp_path):
    from dflash_doctor.scan import source_file as source

    (tmp_path / "huge.py").write_text("x = 1\n" * 100)
    assert source.read_bytes(str(tmp_path / "huge.py"), max_read=100).reason == (
        "not read: 600 bytes is over the 100-byte read cap")


@pytest.mark.skipif(not hasattr(os, "setuid") or os.geteuid() != 0, reason="drops root to lose read permission")
@pytest.mark.timeout(120)
def test_unlistable_folder_is_a_problem_with_exit_bit_4():
    """Run as root here, so the child imports everything first and then becomes `nobody`: a real permission
    error from the operating system, not a simulated one (pytest's own temporary folders are private to root)."""
    top = Path(tempfile.mkdtemp(prefix="dfd-unlistable-"))
    try:
        _scan_as_nobody(top)
    finally:
        shutil.rmtree(top)


def _scan_as_nobody(top: Path) -> None:
    tree = top / "tree"
    (tree / "locked").mkdir(parents=True)
    (tree / "locked" / "mod.py").write_text(BAD)
    (tree / "open.py").write_text(BAD)
    os.chmod(top, 0o755)
    os.chmod(tree, 0o755)
    os.chmod(tree / "open.py", 0o644)
    os.chmod(tree / "locked", 0o700)
    script = textwrap.dedent(f"""\
        import json, os, sys
        from dflash_doctor.scan import scan_paths
        # What the scan imports on first use (the fingerprints' hashlib among them), imported while still root:
        # this machine's Python lives in root's home, which `nobody` cannot read.
        import hashlib, importlib.metadata, dflash_doctor.scan.analysis, dflash_doctor.rules.scan
        os.setgid(65534)
        os.setuid(65534)
        report = scan_paths([{str(tree)!r}], jobs=1)
        json.dump({{"problems": [p.to_dict() for p in report.problems], "exit": report.exit_code(),
                   "findings": [os.path.basename(f.path) for f in report.findings]}}, sys.stdout)
    """)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["problems"] == [{
        "subject": str(tree / "locked"), "reason": "cannot list folder: Permission denied",
        "hint": "check its permissions; nothing below it was scanned",
    }]
    assert result["findings"] == ["open.py"]
    assert result["exit"] == 5


def test_cr_only_source_is_scanned_like_any_other(tmp_path):
    source = (
        "import threading\rimport torch\rfrom torch.utils.checkpoint import checkpoint\r"
        "step = torch.compile(lambda x: x)\r"
        "def worker():\r    return checkpoint(step, 1)\r"
        "threading.Thread(target=worker).start()\r"
    )
    (tmp_path / "old_mac.py").write_bytes(source.encode())
    (tmp_path / "windows.py").write_bytes(source.replace("\r", "\r\n").encode())
    report = scan_paths([str(tmp_path)], jobs=1)
    found = sorted((os.path.basename(f.path), f.line, f.column, f.code) for f in report.findings)
    expected = [(6, 12, "DFD102"), (7, 1, "DFD201")]
    assert found == sorted((name, *e) for name in ("old_mac.py", "windows.py") for e in expected)


@pytest.mark.parametrize("option", ["select", "ignore"])
@pytest.mark.parametrize("spec", [",,,", " , ", ""])
def test_selection_naming_no_rule_is_a_usage_error(tmp_path, option, spec):
    (tmp_path / "a.py").write_text(BAD)
    with pytest.raises(UsageError, match="names no rule"):
        scan_paths([str(tmp_path)], jobs=1, **{option: spec})


@pytest.mark.timeout(120)
def test_cli_select_commas_only_exits_2(cli, tmp_path):
    (tmp_path / "a.py").write_text(BAD)
    run = cli("scan", tmp_path, "--select", ",,,")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "dflash-doctor: error: --select ',,,' names no rule; scan rules are " + ", ".join(sorted(SCAN_RULES))]


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS file systems refuse names that are not UTF-8")
def test_a_file_name_that_is_not_utf8_is_scanned_and_fingerprinted(tmp_path):
    folder = os.fsencode(tmp_path)
    with open(os.path.join(folder, b"caf\xe9.py"), "w") as handle:
        handle.write("import torch\ntorch.utils.checkpoint.checkpoint(f, x, use_reentrant=True)\n")
    report = scan_paths([str(tmp_path)], jobs=1)
    [finding] = report.findings
    assert finding.code == "DFD101" and os.fsencode(finding.path).endswith(b"caf\xe9.py")
    assert len(finding.evidence["fingerprint"]) == 24
