"""Every option or argument that names an input (declared in dflash_doctor/inputs.py, read here from the typer
app, so a new one is attacked without editing this file) refuses what it cannot read in one line with exit 2,
within 5 s and the harness's 2 GiB memory limit: a FIFO nobody writes, /dev/zero, a kernel pseudo-file
(/proc/kmsg blocks on read), a folder, a link loop, a file over its cap (a sparse 2 GiB one). The caps move
with --max-input-size, and pyproject.toml, found or named, is read the same way."""
from __future__ import annotations

import json
import os

import pytest

from tests.robustness.harness import DeclaredInput, assert_one_error_line, input_options, run

BOUND_S = 5
DECLARED = input_options()
FILES = [d for d in DECLARED if not d.spec.folder and d.spec.regular_only]
FOLDERS = [d for d in DECLARED if d.spec.folder]
CAPPED = [d for d in DECLARED if d.spec.max_bytes is not None]
STDIN = [d for d in DECLARED if d.spec.stdin]


def test_the_declared_inputs_are_found():
    found = {str(d) for d in DECLARED}
    assert {"scan --baseline", "scan --config", "gpus --from", "status --log", "status --from",
            "report --repro-json", "logs PATH", "pipeline --save", "guards --torch-root"} <= found, found


def _hostile(kind: str, folder) -> str:
    """A path of the given kind in `folder` (or the system's own)."""
    if kind == "fifo":
        path = folder / "hostile.fifo"
        os.mkfifo(path)
        return str(path)
    if kind == "dev-zero":
        return "/dev/zero"
    if kind == "proc-kmsg":
        if not os.path.exists("/proc/kmsg"):
            pytest.skip("no /proc/kmsg here")
        return "/proc/kmsg"
    if kind == "folder":
        path = folder / "a-folder"
        path.mkdir()
        return str(path)
    if kind == "link-loop":
        path = folder / "loop.json"
        path.symlink_to(path.name)
        return str(path)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "proc-kmsg", "folder", "link-loop"])
@pytest.mark.parametrize("declared", FILES, ids=str)
def test_a_file_input_that_is_not_a_regular_file_is_one_line(tmp_path, declared: DeclaredInput, kind):
    path = _hostile(kind, tmp_path)
    result = run(declared.command, *declared.argv(tmp_path, path), cwd=tmp_path, timeout=BOUND_S)
    assert_one_error_line(result, 2, path)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
@pytest.mark.parametrize("declared", FOLDERS, ids=str)
def test_a_folder_input_that_is_not_a_folder_is_one_line(tmp_path, declared: DeclaredInput, kind):
    path = _hostile(kind, tmp_path)
    result = run(declared.command, *declared.argv(tmp_path, path), cwd=tmp_path, timeout=BOUND_S)
    assert_one_error_line(result, 2, path, "not a folder")


@pytest.mark.parametrize("declared", CAPPED, ids=str)
def test_a_sparse_file_over_the_cap_is_refused_without_reading_it(tmp_path, declared: DeclaredInput):
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as handle:
        handle.truncate(2 * 2**30)  # 2 GiB of nothing on disk; reading it would pass the 2 GiB memory limit
    result = run(declared.command, *declared.argv(tmp_path, huge), cwd=tmp_path, timeout=BOUND_S)
    assert_one_error_line(result, 2, str(huge), "--max-input-size")


@pytest.mark.parametrize("declared", [d for d in DECLARED if not d.spec.folder], ids=str)
def test_a_kernel_pseudo_file_is_refused_by_every_file_input(tmp_path, declared: DeclaredInput):
    """Even where the reader takes any kind of file (logs FILE): /proc/kmsg reports size 0 and blocks."""
    path = _hostile("proc-kmsg", tmp_path)
    result = run(declared.command, *declared.argv(tmp_path, path), cwd=tmp_path, timeout=BOUND_S)
    assert_one_error_line(result, 2, path, "kernel interface")


@pytest.mark.parametrize("declared", STDIN, ids=str)
def test_dash_with_stdin_closed_is_one_line(tmp_path, declared: DeclaredInput):
    result = run(declared.command, *declared.argv(tmp_path, "-"), cwd=tmp_path, timeout=BOUND_S, closed=(0,))
    assert_one_error_line(result, 2, "standard input is closed")


@pytest.fixture
def baseline(tmp_path):
    source = tmp_path / "t.py"
    source.write_text("import torch\ntorch.utils.checkpoint.checkpoint(f, x)\n", encoding="utf-8")
    result = run("scan", source, "-f", "json", "-o", tmp_path / "b.json", cwd=tmp_path)
    assert result.returncode == 1, result
    return source, tmp_path / "b.json"


def test_the_cap_moves_with_max_input_size(tmp_path, baseline):
    source, known = baseline
    size = known.stat().st_size
    small = run("--max-input-size", str(size - 1), "scan", source, "--baseline", known, cwd=tmp_path)
    assert_one_error_line(small, 2, "over the", "cap", "--max-input-size")
    enough = run("--max-input-size", "1MiB", "scan", source, "--baseline", known, "-f", "json", cwd=tmp_path)
    assert enough.returncode == 0 and json.loads(enough.stdout)["findings"] == [], enough
    assert_one_error_line(run("--max-input-size", "lots", "scan", source, cwd=tmp_path), 2, "--max-input-size")


UNPARSABLE = {  # kind: (content, what the line says)
    "binary": (b"\x00\x01binary\xff" * 100, "binary data"),
    "latin-1": ("[tool.dflash-doctor]\nselect = ['caf\xe9']\n".encode("latin-1"), "not UTF-8"),
    "nested-100000-deep": (b"a = " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested too deeply"),
}


@pytest.mark.parametrize("kind", UNPARSABLE)
def test_a_pyproject_that_cannot_be_parsed_is_one_line(baseline, kind):
    content, says = UNPARSABLE[kind]
    source, _ = baseline
    folder = source.parent
    (folder / "pyproject.toml").write_bytes(content)
    assert_one_error_line(run("scan", source, cwd=folder, timeout=BOUND_S), 2, "pyproject.toml", says)
    assert_one_error_line(run("scan", source, "--config", folder / "pyproject.toml", cwd=folder,
                              timeout=BOUND_S), 2, "pyproject.toml", says)


def test_a_deeply_nested_baseline_is_one_line(baseline):
    source, _ = baseline
    deep = source.parent / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    assert_one_error_line(run("scan", source, "--baseline", deep, cwd=source.parent, timeout=BOUND_S), 2,
                          "--baseline", "nested too deeply")


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "self-link"])
def test_a_pyproject_found_upward_that_is_not_a_file_is_never_passed_over(baseline, kind):
    """The settings it should have held would be lost in silence: it is one line instead."""
    source, _ = baseline
    pyproject = source.parent / "pyproject.toml"
    if kind == "fifo":
        os.mkfifo(pyproject)
    elif kind == "self-link":
        pyproject.symlink_to("pyproject.toml")
    else:
        pyproject.symlink_to("/dev/zero")
    assert_one_error_line(run("scan", source, cwd=source.parent, timeout=BOUND_S), 2, str(pyproject))
    # --no-config is the way past it
    assert run("scan", source, "--no-config", cwd=source.parent, timeout=BOUND_S).returncode == 1
