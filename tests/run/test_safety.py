"""`run` on a shared machine, as a careful user and as a local attacker would try it: real processes, real signals,
real files, and a second local user where the case needs one (these machines run the tests as root)."""
from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.run.helpers import gone, program, read_line_with, start_cli

ATTACKER = "dfdattacker"


def _pids(line: str):
    return [int(word) for word in line.split()[1:]]


def _wait_gone(pids, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(gone(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return all(gone(pid) for pid in pids)


def _attacker_uid() -> int:
    if os.geteuid() != 0:
        pytest.skip("needs root, to add the second local user")
    import pwd

    try:
        return pwd.getpwnam(ATTACKER).pw_uid
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", ATTACKER], check=True,
                       capture_output=True, timeout=30)
        return pwd.getpwnam(ATTACKER).pw_uid


def _as_user(uid: int, code: str, *args: str) -> None:
    """Run `code` in a forked child that dropped to `uid` (the attacker; the interpreter itself may live where
    that user cannot execute it, so the child does not exec)."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.setgid(uid)
            os.setuid(uid)
            sys.argv = ["attacker", *args]
            exec(compile(code, "attacker", "exec"), {"__name__": "attacker"})
            status = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


_PLANT = """
import json, os, sys
folder, victim = sys.argv[1], sys.argv[2]
os.mkdir(folder, 0o700)
os.chmod(folder, 0o777)
with open(os.path.join(folder, 'config.json'), 'w') as handle:
    json.dump({'hang_after_s': 1.0, 'cycle_confirm_s': 0.1, 'fixes': ['global-lock']}, handle)
with open(os.path.join(folder, 'token'), 'w') as handle:
    handle.write(sys.argv[3])
for name in ['bootstrap-errors.txt', 'proc-%s.json' % sys.argv[4], 'fault-%s.txt' % sys.argv[4]]:
    os.symlink(victim, os.path.join(folder, name))
for pid in range(int(sys.argv[4]), int(sys.argv[4]) + 400):
    for name in ('proc-%d.json' % pid, 'fault-%d.txt' % pid):
        if not os.path.lexists(os.path.join(folder, name)):
            os.symlink(victim, os.path.join(folder, name))
"""


@pytest.mark.timeout(120)
def test_a_survivor_of_the_run_writes_nothing_into_a_folder_another_user_recreated(cli, tmp_path):
    import tempfile

    uid = _attacker_uid()
    scratch = Path(tempfile.mkdtemp(prefix="dfd-shared-tmp-", dir="/tmp"))
    os.chmod(scratch, 0o1777)  # a shared temporary folder, as /tmp is (the test's own folder is root's alone)
    try:
        _survivor_case(cli, tmp_path, scratch, uid)
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)


def _survivor_case(cli, tmp_path, scratch, uid):
    # What the survivor inherits: the command's own environment, printed by the command itself.
    show = ("import json, os, threading; t = threading.Thread(target=print); t.start(); t.join(); "
            "print(json.dumps({k: v for k, v in os.environ.items() if k.startswith(('DFLASH', 'PYTHONPATH'))}))")
    proc = cli("run", "--", sys.executable, "-c", show, env={"TMPDIR": str(scratch)}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    inherited = json.loads(proc.stdout.splitlines()[-1])
    folder = inherited["DFLASH_DOCTOR_RUN_SESSION"]
    assert not os.path.exists(folder)  # the run removed it
    victim = tmp_path / "root-profile.sh"
    victim.write_text("export PATH=/usr/bin\n")
    os.chmod(victim, 0o644)
    # The attacker re-creates the folder (they can guess even the token: the test hands it over) and plants links.
    _as_user(uid, _PLANT, folder, str(victim), inherited["DFLASH_DOCTOR_RUN_TOKEN"], str(os.getpid()))
    survivor = ("import threading, os, sys\n"
                "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
                "print('agent' if 'dflash_doctor.supervise.agent' in sys.modules else 'none')\n"
                "import faulthandler; print(faulthandler.is_enabled())\n")
    for _ in range(3):  # several interpreters of the survivor, each a fresh pid
        done = subprocess.run([sys.executable, "-c", survivor], capture_output=True, text=True, timeout=60,
                              env={**os.environ, **inherited}, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert victim.read_text() == "export PATH=/usr/bin\n"
    assert {entry.lstat().st_uid for entry in Path(folder).iterdir()} == {uid}  # root made nothing in it


def test_the_session_folder_checks_refuse_a_link_another_owner_a_loose_mode_and_another_token(tmp_path):
    from dflash_doctor.supervise.session import RunConfig, Session
    from dflash_doctor.supervise.sessionfs import SessionFolder, SessionRefused

    session = Session.create(RunConfig())
    try:
        folder = SessionFolder(str(session.path), session.token)
        folder.create("proc-1.json", b"{}")
        assert folder.read("proc-1.json") == b"{}"
        assert SessionFolder(str(session.path), "0" * 32).read.__self__  # constructed; refused on use:
        with pytest.raises(SessionRefused, match="another run's token"):
            SessionFolder(str(session.path), "0" * 32).read("proc-1.json")
        link = tmp_path / "link"
        link.symlink_to(session.path)
        with pytest.raises(SessionRefused, match="cannot be opened"):
            SessionFolder(str(link), session.token).read("proc-1.json")
        os.chmod(session.path, 0o755)
        with pytest.raises(SessionRefused, match="mode 755"):
            folder.read("proc-1.json")
        os.chmod(session.path, 0o700)
        victim = tmp_path / "victim"
        victim.write_text("kept")
        os.symlink(victim, session.path / "planted.txt")
        with pytest.raises(FileExistsError):
            folder.create("planted.txt", b"attacker text")
        with pytest.raises(OSError):
            folder.read("planted.txt")  # never followed
        folder.replace("planted.txt", b"record")  # the link itself is replaced, never its target
        assert victim.read_text() == "kept" and not (session.path / "planted.txt").is_symlink()
        if os.geteuid() == 0:
            uid = _attacker_uid()
            os.chown(session.path, uid, uid)
            with pytest.raises(SessionRefused, match=f"belongs to uid {uid}"):
                folder.read("proc-1.json")
    finally:
        session.close(remove=True)


@pytest.mark.timeout(90)
def test_processes_the_command_left_in_other_sessions_and_groups_are_ended_and_named(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = start_cli("run", "--", sys.executable, program("escapers.py"), "exit", env={"TMPDIR": str(scratch)})
    try:
        main, *helpers = _pids(read_line_with(proc.stdout, "pids"))
        assert proc.wait(60) == 0
        stderr = proc.stderr.read()
    finally:
        proc.kill()
    assert _wait_gone(helpers), stderr
    line, = [line for line in stderr.splitlines() if "left running" in line]
    assert line.startswith("dflash-doctor: ended 3 process(es) the command left running: ")
    assert all(f"{pid} (sleep)" in line for pid in helpers)
    assert list(scratch.iterdir()) == []


@pytest.mark.timeout(90)
def test_leave_running_names_what_the_command_left_and_ends_nothing(tmp_path):
    proc = start_cli("run", "--leave-running", "--", sys.executable, program("escapers.py"), "exit")
    helpers = []
    try:
        main, *helpers = _pids(read_line_with(proc.stdout, "pids"))
        assert proc.wait(60) == 0
        alive = [pid for pid in helpers if not gone(pid)]
    finally:
        proc.kill()
        for pid in helpers:  # they hold run's stderr open: end them before reading it to its end
            os.kill(pid, signal.SIGKILL)
    stderr = proc.stderr.read()
    assert alive == helpers, stderr
    line, = [line for line in stderr.splitlines() if "left running" in line]
    assert line.startswith("dflash-doctor: left running (--leave-running) 3 process(es)")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sent", [signal.SIGQUIT, signal.SIGUSR1, signal.SIGALRM, signal.SIGHUP])
def test_a_signal_that_ends_run_ends_the_whole_command_and_the_session_folder(tmp_path, sent):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = start_cli("run", "--", sys.executable, program("escapers.py"), "wait", env={"TMPDIR": str(scratch)})
    try:
        pids = _pids(read_line_with(proc.stdout, "pids"))
        proc.send_signal(sent)
        assert proc.wait(60) == 128 + sent  # the command died of it, as it would have without the tool
    finally:
        proc.kill()
    assert _wait_gone(pids)
    assert list(scratch.iterdir()) == []


@pytest.mark.timeout(120)
def test_sigkill_to_run_still_ends_the_command_and_removes_the_session_folder(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = start_cli("run", "--", sys.executable, program("escapers.py"), "wait", env={"TMPDIR": str(scratch)})
    try:
        pids = _pids(read_line_with(proc.stdout, "pids"))
        assert len(list(scratch.iterdir())) == 1
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    assert _wait_gone(pids, 15)
    deadline = time.monotonic() + 10
    while list(scratch.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(scratch.iterdir()) == []


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(120)
def test_on_hang_kill_ends_a_deadlocked_worker_in_its_own_session(cli, tmp_path):
    out = tmp_path / "run.json"
    proc = cli("run", "--on-hang", "kill", "-f", "json", "-o", out, "--", sys.executable,
               program("setsid_deadlock.py"), timeout=100)
    worker = int(proc.stdout.split()[1])
    assert gone(worker), proc.stderr
    assert proc.returncode == 137, proc.stderr
    killed, = [line for line in proc.stderr.splitlines() if "(--on-hang kill):" in line]
    assert f"{worker} (python" in killed  # said what was ended, the worker in its own session included
    assert [f["code"] for f in json.loads(out.read_text())["findings"]] == ["DFD903"]


@pytest.mark.timeout(120)
def test_a_death_is_announced_while_the_command_runs_and_a_broken_stderr_does_not_end_it(tmp_path):
    told, marker = tmp_path / "told", tmp_path / "marker"
    proc = start_cli("run", "-f", "json", "-o", tmp_path / "run.json", "--", sys.executable,
                     program("thread_death_then_exit.py"), told, marker)
    try:
        line = read_line_with(proc.stderr, "DFD906")
        assert "loader-0" in line and proc.poll() is None  # announced while it runs
        proc.stderr.close()  # the reader of run's stderr goes away: later lines get EPIPE
        told.write_text("go")
        assert proc.wait(60) == 3  # the command's own code: the tool's broken stderr changed nothing
    finally:
        proc.kill()
    assert marker.read_text() == "still running"
    doc = json.loads((tmp_path / "run.json").read_text())
    assert [f["code"] for f in doc["findings"]] == ["DFD906"]


_FORGE = """
import os, sys, threading
t = threading.Thread(target=lambda: None); t.start(); t.join()
folder = os.environ['DFLASH_DOCTOR_RUN_SESSION']
with open(os.path.join(folder, 'proc-999991.json'), 'w') as handle:
    handle.write('{"version": 1, "pid": 1e400}')
with open(os.path.join(folder, 'proc-999992.json'), 'w') as handle:
    handle.write('[' * 100000 + ']' * 100000)
with open(os.path.join(folder, 'proc-999993.json'), 'w') as handle:
    handle.write('{"version": 1, "pid": 5, "hang": {"diagnosis": 7}}')
sys.exit(5)
"""


@pytest.mark.timeout(90)
def test_records_that_cannot_be_read_are_problems_and_the_exit_code_stays_the_commands(cli, tmp_path):
    out = tmp_path / "run.json"
    proc = cli("run", "-f", "json", "-o", out, "--", sys.executable, "-c", _FORGE, timeout=80)
    assert proc.returncode == 5, proc.stderr
    assert "internal error" not in proc.stderr
    problems = {p["subject"]: p["reason"] for p in json.loads(out.read_text())["problems"]}
    assert "'pid' is not an integer in range: inf" in problems["proc-999991.json"]
    assert "not a record" in problems["proc-999992.json"] or "nested" in problems["proc-999992.json"]
    assert "missing field" in problems["proc-999993.json"]


@pytest.mark.timeout(90)
def test_an_output_that_cannot_be_written_goes_to_a_fallback_and_keeps_the_exit_code(cli, tmp_path):
    folder = tmp_path / "reports"
    folder.mkdir()
    # the folder becomes a file while the command runs (as root, permissions would not stop the write)
    code = f"import shutil, sys; shutil.rmtree({str(folder)!r}); open({str(folder)!r}, 'w').close(); sys.exit(3)"
    proc = cli("run", "-f", "json", "-o", folder / "run.json", "--", sys.executable, "-c", code, timeout=60)
    assert proc.returncode == 3, proc.stderr
    fallback = [word for word in proc.stderr.split() if "dflash-doctor-run-" in word and word.endswith(".json")]
    assert fallback, proc.stderr
    assert json.loads(Path(fallback[0].rstrip(")")).read_text())["facts"]["trials"][0]["exit_code"] == 3


def test_output_never_names_an_input_of_the_command(cli, tmp_path):
    victim = tmp_path / "victim.py"
    victim.write_text("print('mine')\n")
    proc = cli("run", "-o", victim, "--", sys.executable, victim, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "refusing to overwrite an input" in proc.stderr
    assert victim.read_text() == "print('mine')\n"


def _exec_cases(folder: Path):
    (folder / "noshebang").write_text("echo hi\n")
    (folder / "garbage").write_bytes(b"\x7fELF" + bytes(range(256)) * 4)
    (folder / "badinterp").write_text("#!/nonexistent/python3\nprint('x')\n")
    (folder / "plain").write_text("#!/bin/sh\n")
    for name in ("noshebang", "garbage", "badinterp"):
        os.chmod(folder / name, 0o755)
    os.symlink("loop-b", folder / "loop-a")
    os.symlink("loop-a", folder / "loop-b")
    return [("./noshebang", 126, "not a program this machine can run"),
            ("./garbage", 126, "not a program this machine can run"),
            ("./loop-a", 126, "Too many levels of symbolic links"),
            ("./" + "x" * 300, 126, "File name too long"),
            ("./badinterp", 127, "#! interpreter was not found (#!/nonexistent/python3)"),
            ("./plain", 126, "permission denied"),
            ("no-such-program-anywhere", 127, "command not found")]


def test_a_command_that_cannot_be_executed_is_one_line_with_the_shells_code(cli, tmp_path):
    for command, code, words in _exec_cases(tmp_path):
        proc = cli("run", "--", command, timeout=60, cwd=tmp_path)
        assert proc.returncode == code, (command, proc.stderr)
        line, = proc.stderr.strip().splitlines()
        assert line.startswith("dflash-doctor: error: ") and words in line, (command, line)


@pytest.mark.timeout(90)
def test_local_modules_named_like_standard_ones_still_shadow_them(cli, tmp_path):
    (tmp_path / "json.py").write_text("WHOSE = 'mine'\n")
    (tmp_path / "dflash_doctor.py").write_text("WHOSE = 'mine'\n")
    (tmp_path / "csv.py").write_text("WHOSE = 'mine'\n")
    script = tmp_path / "train.py"
    script.write_text("import json, sys, threading\n"
                      "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
                      # after the agent started: it must not have loaded the standard one, nor its own, for us
                      "import csv, dflash_doctor\n"
                      "print(json.WHOSE, dflash_doctor.WHOSE, csv.WHOSE)\n"
                      "sys.stdout.flush()\n")
    elsewhere = tmp_path / "elsewhere"  # the CLI's own working folder: `python -m` would import from it
    elsewhere.mkdir()
    plain = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=60, cwd=elsewhere)
    under = cli("run", "--", sys.executable, script, timeout=60, cwd=elsewhere)
    assert plain.stdout == "mine mine mine\n", plain.stderr
    assert (under.returncode, under.stdout) == (0, plain.stdout), under.stderr
    assert "0 Python process" not in under.stderr  # and the agent did run in it


@pytest.mark.timeout(60)
def test_a_closed_stdin_stays_closed(tmp_path):
    probe = "import os\ntry:\n    os.fstat(0); print('open')\nexcept OSError:\n    print('closed')\n"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    plain = subprocess.run(["bash", "-c", f'exec 0<&-; exec "$0" -c "$1"', sys.executable, probe],
                           capture_output=True, text=True, timeout=60, env=env)
    under = subprocess.run(["bash", "-c", 'exec 0<&-; exec "$0" -m dflash_doctor run -- "$0" -c "$1"',
                            sys.executable, probe], capture_output=True, text=True, timeout=60, env=env)
    assert plain.stdout == "closed\n"
    assert under.stdout == plain.stdout, under.stderr


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(120)
def test_an_interpreter_without_psutil_still_gets_the_recorder(cli, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=100)
    python = venv / "bin" / "python"
    assert subprocess.run([python, "-c", "import psutil"], capture_output=True, timeout=60).returncode != 0
    out = tmp_path / "run.json"
    proc = cli("run", "--on-hang", "kill", "-f", "json", "-o", out, "--", python, program("lock_cycle.py"),
               timeout=100)
    assert proc.returncode == 137, proc.stderr
    doc = json.loads(out.read_text())
    assert [f["code"] for f in doc["findings"]] == ["DFD903"] and doc["problems"] == []


def test_json_without_output_is_the_last_line_of_stderr(cli):
    noisy = "import sys; sys.stderr.write('step 1 {\\n'); print('out')"
    proc = cli("run", "-f", "json", "--", sys.executable, "-c", noisy, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "out\n"), proc.stderr
    assert json.loads(proc.stderr.splitlines()[-1])["facts"]["trials"][0]["exit_code"] == 0


@pytest.mark.timeout(90)
def test_a_segfaulting_worker_leaves_its_stacks_in_the_report(cli, tmp_path):
    out = tmp_path / "run.json"
    crash = ("import ctypes, threading\n"
             "def step():\n    ctypes.string_at(0)\n"
             "t = threading.Thread(target=step, name='worker-0'); t.start(); t.join()\n")
    proc = cli("run", "-f", "json", "-o", out, "--", sys.executable, "-c", crash, timeout=80)
    assert proc.returncode == 128 + signal.SIGSEGV, proc.stderr
    doc = json.loads(out.read_text())
    crashed, = doc["facts"]["trials"][0]["crashes"]
    assert "Segmentation fault" in crashed["trace"] and "in step" in crashed["trace"]
    assert any("crashed" in p["reason"] for p in doc["problems"])


@pytest.mark.timeout(90)
def test_a_broken_pipe_in_the_main_thread_is_not_a_finding(tmp_path):
    out = tmp_path / "run.json"
    code = ("import threading\nt = threading.Thread(target=lambda: None); t.start(); t.join()\n"
            "for i in range(200000):\n    print(i)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(["bash", "-c", '"$0" -m dflash_doctor run -f json -o "$1" -- "$0" -c "$2" | head -1',
                           sys.executable, str(out), code], capture_output=True, text=True, timeout=80, env=env)
    assert done.stdout == "0\n", done.stderr
    assert json.loads(out.read_text())["findings"] == []


def _read_until(fd: int, needle: bytes, seconds: float = 30.0) -> bytes:
    seen = b""
    deadline = time.monotonic() + seconds
    while needle not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                seen += os.read(fd, 4096)
            except OSError:
                break
    assert needle in seen, seen[-2000:]
    return seen


@pytest.mark.timeout(120)
def test_ctrl_z_and_fg_leave_the_terminal_working():
    pid, fd = pty.fork()
    if pid == 0:  # an interactive shell with job control on a terminal of its own
        os.environ["PYTHONPATH"] = str(REPO)
        os.environ["PS1"] = "$ "
        os.execvp("bash", ["bash", "--norc", "--noprofile", "-i"])
    try:
        _read_until(fd, b"$ ")
        reader = "import sys; print('ready', flush=True); print('got', sys.stdin.readline().strip(), flush=True)"
        os.write(fd, f'{sys.executable} -m dflash_doctor run -- {sys.executable} -c "{reader}"\n'.encode())
        _read_until(fd, b"ready\r\n")  # the program's line, not the echo of the command line
        time.sleep(0.3)
        os.write(fd, b"\x1a")  # Ctrl-Z
        _read_until(fd, b"Stopped")
        os.write(fd, b"echo shell-works\n")
        _read_until(fd, b"shell-works\r\n")
        os.write(fd, b"fg\n")
        time.sleep(0.5)
        os.write(fd, b"hello\n")
        _read_until(fd, b"got hello")
        os.write(fd, b"echo rc=$?\n")
        _read_until(fd, b"rc=0")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)
