"""The per-process record's codec (supervise/records.py): what the agent writes is what the supervisor reads,
field for field, and anything else is a RecordError, never a default."""
from __future__ import annotations

import json

import pytest

from dflash_doctor.findings import Problem
from dflash_doctor.outcomes import BlameKind, FailureKind, HangCycle, RecorderEventKind
from dflash_doctor.runtime.deadlock import HangDiagnosis
from dflash_doctor.runtime.recorder import Event
from dflash_doctor.runtime.stacks import Frame, ThreadStack
from dflash_doctor.supervise.records import (
    RECORD_VERSION, BlameRecord, DeathRecord, HangRecord, ProcessRecord, RecordError, decode, encode,
)

_WAIT = Frame("/srv/train.py", 41, "step", "with STEP_LOCK:", ((40, "LOAD_LOCK"), (41, "STEP_LOCK")))


def _record() -> ProcessRecord:
    hang = HangRecord(HangDiagnosis(FailureKind.DEADLOCK, HangCycle.LOCK_CYCLE, ("loader holds LOAD_LOCK",),
                                    ("loader", "trainer"), 3.0, "take the locks in one order"),
                      (ThreadStack("loader", 7, (_WAIT,)),), 5.25, 3.75, 1.5)
    return ProcessRecord(
        pid=4242, ppid=1, argv=("train.py", "--steps", "3"), rank=1, local_rank=1, torch_version="2.13.0",
        fx_flag_thread_local=False, fixes=("threadlocal-flag",), problems=(Problem("--fix x", "why", "hint"),),
        events=(Event(0.5, "trainer", 7, RecorderEventKind.COMPILE, "B", {"frame": "forward"}),),
        blames=(BlameRecord("drafter-0", "fx-holder", BlameKind.FX_FLAG_LEAK, "Detected", 1.25, (_WAIT,)),),
        hang=hang, deaths=(DeathRecord("worker-0", "KeyError", "'input_ids'", 2.0, False, (_WAIT,), ("tracer",),
                                       (_WAIT,), None, None),),
        ended="exit", started_at=1765000000.5, fix_facts={"threadlocal-flag": {"installed": True}})


def test_what_is_written_is_what_is_read():
    assert decode(encode(_record())) == _record()


def test_the_vocabularies_are_read_back_as_their_enums_and_a_word_outside_them_is_refused():
    read = decode(encode(_record()))
    assert read.hang is not None and read.hang.diagnosis.cycle is HangCycle.LOCK_CYCLE
    assert read.events[0].kind is RecorderEventKind.COMPILE
    for where, key in ((("events", 0), "kind"), (("hang", "diagnosis"), "cycle")):
        document = json.loads(encode(_record()))
        outer, inner = where
        document[outer][inner][key] = "gremlins"
        with pytest.raises(RecordError, match=f"'{key}' is not one of its vocabulary: gremlins"):
            decode(json.dumps(document).encode())


def test_a_missing_field_a_wrong_version_and_an_out_of_range_number_are_refused():
    document = json.loads(encode(_record()))
    for key in ("pid", "deaths", "hang", "fix_facts"):
        broken = {k: v for k, v in document.items() if k != key}
        with pytest.raises(RecordError, match=f"missing field '{key}'"):
            decode(json.dumps(broken).encode())
    with pytest.raises(RecordError, match="version"):
        decode(json.dumps(dict(document, version=RECORD_VERSION + 1)).encode())
    with pytest.raises(RecordError, match="'pid' is not an integer in range"):
        decode(b'{"version": %d, "pid": 1e400}' % RECORD_VERSION)
    with pytest.raises(RecordError, match="'kind' is not one of its vocabulary"):
        document["blames"][0]["kind"] = "gremlins"
        decode(json.dumps(document).encode())


def test_nesting_and_garbage_are_record_errors_not_crashes():
    for data in (b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe", b"", b'{"version": 1, "pid": 1, "argv": ' +
                 b"[" * 70 + b"]" * 70 + b"}"):
        with pytest.raises(RecordError):
            decode(data)
