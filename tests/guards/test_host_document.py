"""The probe host's document and a forked probe's result cross a process boundary through one codec: what the real
host writes reads back whole, and a document with a field missing, of another version or of the wrong type is
refused by name, never read as a default."""
from __future__ import annotations

import json

import pytest

from dflash_doctor.guards.host_document import (
    HOST_DOCUMENT_VERSION, HostDocument, HostDocumentError, HostSeconds, ProbeResult, decode, decode_result, encode,
    encode_result,
)
from dflash_doctor.guards.probes import PROBE_NAMES
from dflash_doctor.guards.runner import ChildResult, host_argv, run_child, run_probes
from dflash_doctor.guards.state import CONFIG_FLAGS, LiveState
from dflash_doctor.guards.torch_sources import installed_torch_root
from dflash_doctor.outcomes import ProbeOutcome


@pytest.fixture(scope="module")
def host_line() -> str:
    """The last stdout line of the real probe host, every probe forked (the forked results cross the pipe through
    the same codec)."""
    if installed_torch_root() is None:
        pytest.skip("runs the installed torch")
    child = run_child(host_argv(PROBE_NAMES, 90, "_is_fx_tracing_flag", "fork"), timeout=120)
    assert child.returncode == 0 and not child.timed_out, child.stderr[-2000:]
    return child.stdout.splitlines()[-1]


def _sample() -> HostDocument:
    state = LiveState({"error_on_nested_fx_trace": True, "force_compile_during_fx_trace": False}, False, 0)
    probes = {"stuck_flag": ProbeResult(ProbeOutcome.REPRODUCED, 0.2, detail="raised"),
              "patcher_race": ProbeResult.failed("the probe process exited with status 3 without a result")}
    return HostDocument(state, probes, HostSeconds(1.7, 2.1))


@pytest.mark.timeout(150)
def test_the_real_host_document_reads_back_whole(host_line):
    document = decode(host_line)
    assert set(document.probes) == set(PROBE_NAMES)
    # torch 2.13 (the CI's): a module-global flag, so each probe reproduces its hazard in its own forked process
    assert {name: result.outcome for name, result in document.probes.items()} == dict.fromkeys(
        PROBE_NAMES, ProbeOutcome.REPRODUCED)
    assert all(result.detail and result.error is None and result.seconds is not None
               for result in document.probes.values())
    assert document.state == LiveState({"error_on_nested_fx_trace": True, "force_compile_during_fx_trace": False},
                                       False, 0)
    assert 0 < document.seconds.imported <= document.seconds.total
    assert decode(encode(document)) == document
    assert json.loads(encode(document)) == json.loads(host_line)  # nothing the host wrote is lost or added


@pytest.mark.parametrize("path", [
    ("version",), ("state",), ("state", "config"), ("state", "config", CONFIG_FLAGS[0]),
    ("state", "config", CONFIG_FLAGS[1]), ("state", "fx_flag_now"), ("state", "gpu_count"), ("probes",),
    ("probes", "stuck_flag", "outcome"), ("probes", "stuck_flag", "seconds"), ("probes", "stuck_flag", "detail"),
    ("probes", "stuck_flag", "error"), ("seconds",), ("seconds", "import"), ("seconds", "total"),
])
def test_a_document_missing_any_field_is_refused_by_its_name(path):
    raw = json.loads(encode(_sample()))
    holder = raw
    for key in path[:-1]:
        holder = holder[key]
    del holder[path[-1]]
    with pytest.raises(HostDocumentError, match=f"^missing field '{path[-1]}'$"):
        decode(json.dumps(raw))


@pytest.mark.parametrize("version", [HOST_DOCUMENT_VERSION + 1, str(HOST_DOCUMENT_VERSION), 0, None])
def test_a_document_of_another_version_is_refused(version):
    raw = json.loads(encode(_sample()))
    raw["version"] = version
    with pytest.raises(HostDocumentError, match=f"^a document of version {version}, this reader knows "
                                                f"{HOST_DOCUMENT_VERSION}$"):
        decode(json.dumps(raw))


@pytest.mark.parametrize("change, message", [
    (lambda raw: raw["probes"]["stuck_flag"].update(outcome="maybe"), "'outcome' is not a probe outcome: maybe"),
    (lambda raw: raw["probes"]["stuck_flag"].update(seconds=-1), "'seconds' is not a number of seconds: -1"),
    (lambda raw: raw["state"].update(gpu_count=True), "'gpu_count' is not a count: True"),
    (lambda raw: raw["state"]["config"].update(error_on_nested_fx_trace="yes"),
     "'error_on_nested_fx_trace' is not true, false or null"),
    (lambda raw: raw["probes"]["stuck_flag"].update(detail=3), "'detail' is not a string"),
    (lambda raw: raw.update(probes=[]), "'probes' is not an object"),
])
def test_a_field_of_the_wrong_type_is_refused(change, message):
    raw = json.loads(encode(_sample()))
    change(raw)
    with pytest.raises(HostDocumentError, match=f"^{message}$"):
        decode(json.dumps(raw))


def test_a_forked_probe_result_round_trips_and_is_as_strict():
    result = ProbeResult(ProbeOutcome.NOT_REPRODUCED, 0.25, detail="ran")
    assert decode_result(encode_result(result)) == result
    raw = json.loads(encode_result(result))
    for key in ("version", "outcome", "seconds", "detail", "error"):
        partial = {k: v for k, v in raw.items() if k != key}
        with pytest.raises(HostDocumentError, match=f"^missing field '{key}'$"):
            decode_result(json.dumps(partial).encode())
    with pytest.raises(HostDocumentError, match="^a document of version 2"):
        decode_result(json.dumps({**raw, "version": 2}).encode())
    with pytest.raises(HostDocumentError, match="^not JSON"):
        decode_result(b"\xff{")


def test_guards_names_a_refused_host_document_on_every_probe():
    """A host of another version (another copy of the tool first on the child's path): each probe is an error
    that says why."""
    newer = {**json.loads(encode(_sample())), "version": HOST_DOCUMENT_VERSION + 1}
    run = run_probes(PROBE_NAMES, timeout=5, fork=True,
                     runner=lambda argv, timeout: ChildResult(0, "\n" + json.dumps(newer) + "\n", "", 2.5))
    expected = (f"the probe host's document was refused: a document of version {HOST_DOCUMENT_VERSION + 1}, "
                f"this reader knows {HOST_DOCUMENT_VERSION}")
    assert run.results == dict.fromkeys(PROBE_NAMES, ProbeResult(ProbeOutcome.ERROR, 2.5, error=expected))
    assert run.state is None


def test_probe_details_in_the_facts_keep_only_the_texts_a_probe_gave():
    assert ProbeResult(ProbeOutcome.REPRODUCED, 0.2, detail="raised").to_facts() == {
        "outcome": "reproduced", "seconds": 0.2, "detail": "raised"}
    assert ProbeResult.failed("timed out", 1.23456).to_facts() == {
        "outcome": "error", "seconds": 1.235, "error": "timed out"}
