"""The warm-start server's lines (repro/warm_protocol.py): each kind reads back as written, a line of another
version or with a field missing is refused by name, and a harness that meets one starts its children fresh and
says why, instead of waiting on answers it cannot read."""
from __future__ import annotations

import json
import sys

import pytest

from dflash_doctor.repro import warm_protocol
from dflash_doctor.repro.warm_protocol import Exited, Forked, ForkRequest, ProtocolError, Ready

REQUEST = ForkRequest(3, ("/tmp/p/spec.json", "/tmp/p/result.json"), {"PATH": "/usr/bin"}, "/tmp/p", "/tmp/p/log.txt",
                      ("/home/me/project",))


def test_every_kind_of_line_reads_back_as_written():
    assert warm_protocol.decode_request(warm_protocol.encode(REQUEST)) == REQUEST
    for message in (Ready(41), Forked(3, 42), Exited(42, -9)):
        line = warm_protocol.encode(message)
        assert line.endswith("\n") and line.count("\n") == 1  # one message a line
        assert warm_protocol.decode_message(line) == message


def test_a_line_that_is_not_json_is_no_message():
    assert warm_protocol.decode_message("Warning: something an import printed\n") is None


@pytest.mark.parametrize("change, words", [({"version": 2}, "version 2"), ({"version": None}, "version None")])
def test_another_version_is_refused(change, words):
    document = {**json.loads(warm_protocol.encode(Forked(1, 2))), **change}
    with pytest.raises(ProtocolError, match=words):
        warm_protocol.decode_message(json.dumps(document))


@pytest.mark.parametrize("field", ["pid", "ident", "kind"])
def test_a_missing_or_renamed_field_is_refused_by_name(field):
    document = json.loads(warm_protocol.encode(Forked(1, 2)))
    document["id" if field == "ident" else f"{field}_"] = document.pop(field)  # renamed
    with pytest.raises(ProtocolError, match=f"no field '{field}'"):
        warm_protocol.decode_message(json.dumps(document))


def test_a_request_must_be_a_fork_with_string_environment():
    with pytest.raises(ProtocolError, match="not 'fork'"):
        warm_protocol.decode_request(warm_protocol.encode(Ready(1)))
    document = json.loads(warm_protocol.encode(REQUEST))
    document["env"]["N"] = 3
    with pytest.raises(ProtocolError, match="env"):
        warm_protocol.decode_request(json.dumps(document))


# A server of another version: it answers its ready line in a layout this harness does not read, then waits for
# the harness to close its stdin.
OLD_SERVER = "import json, sys\nprint(json.dumps({'ready': 1}), flush=True)\nsys.stdin.read()\n"


@pytest.mark.timeout(60)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the warm start forks on Linux only")
def test_a_server_speaking_another_version_means_fresh_children_and_says_why(tmp_path):
    from dflash_doctor.repro import warm_start

    # The runner's interpreter, standing in for another install's: whatever it is asked to run, it runs the old
    # server (the arguments the runner passes are ignored).
    python = tmp_path / "old-python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -c \"{OLD_SERVER}\"\n")
    python.chmod(0o755)
    runner = warm_start.WarmStartRunner(tmp_path, python=str(python))
    try:
        assert runner._start_server({"PATH": "/usr/bin:/bin"}) is None
    finally:
        runner.close()
    assert runner.unavailable and "did not get ready" in runner.unavailable
    assert "a warm-start line has no field 'version'" in runner.unavailable
