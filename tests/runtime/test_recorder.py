"""The flight recorder on real torch: FX traces, Dynamo compiles with the recompile reason, steps, exceptions with
blame (leak and stuck flag), uncaught thread exceptions; and its Chrome-trace export."""
from __future__ import annotations

import json
import threading

import pytest

torch = pytest.importorskip("torch")

from dflash_doctor import runtime  # noqa: E402
from dflash_doctor.outcomes import RecorderEventKind  # noqa: E402
from dflash_doctor.repro import disturb  # noqa: E402
from dflash_doctor.runtime.chrome_trace import chrome_trace, write_chrome_trace  # noqa: E402

FX_ERROR = ("Detected that you are using FX to symbolically trace a dynamo-optimized function. "
            "This is not supported at the moment.")


@pytest.fixture
def recorder():
    import torch.fx._symbolic_trace as symbolic_trace

    original_trace = symbolic_trace.Tracer.trace
    recorder = runtime.install(runtime.FlightRecorder())
    yield recorder
    runtime.uninstall()
    symbolic_trace._is_fx_tracing_flag = False  # the stuck test leaves torch's global set; this process goes on
    assert symbolic_trace.Tracer.trace is original_trace


def in_thread(target, name):
    thread = threading.Thread(target=target, name=name)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()


def kinds(recorder, thread=None):
    return [(e.kind, e.phase) for e in recorder.events if thread is None or e.thread == thread]


@pytest.mark.timeout(120)
def test_compiles_fx_traces_and_the_recompile_reason_are_logged_per_thread(recorder):
    fn = torch.compile(lambda t: t.sin() * 2, backend="aot_eager")

    def worker():
        fn(torch.randn(3))
        fn(torch.randn(3, 4))  # rank change: a guard fails, Dynamo recompiles

    in_thread(worker, "compiler-7")
    mine = kinds(recorder, "compiler-7")
    assert mine.count(("compile", "B")) == 2 and mine.count(("compile", "E")) == 2
    assert ("fx-trace", "B") in mine and ("fx-trace", "E") in mine  # AOTAutograd's make_fx goes through Tracer.trace
    reasons = [e.detail["reason"] for e in recorder.events if e.kind == "recompile"]
    assert len(reasons) == 1 and "rank mismatch" in reasons[0]
    assert recorder.fx_holders() == []


@pytest.mark.timeout(120)
def test_an_fx_error_is_blamed_on_the_thread_inside_a_trace(recorder):
    fn = torch.compile(lambda t: t + 1, backend="eager")
    fn(torch.ones(1))
    held = disturb.hold_fx_flag(30, name="the-holder")
    errors = []

    def victim():
        try:
            with recorder.step(0):
                fn(torch.ones(1))
        except RuntimeError as exc:
            errors.append(str(exc))

    try:
        assert recorder.fx_holders() == ["the-holder"]
        in_thread(victim, "victim-1")
    finally:
        held.stop()
    assert errors == [FX_ERROR]
    [blame] = recorder.blames
    assert (blame.victim, blame.holder, blame.kind) == ("victim-1", "the-holder", "fx-flag-leak")
    assert 0 < blame.at_s <= recorder.now()
    assert kinds(recorder, "victim-1") == [("step", "B"), ("exception", "I"), ("step", "E")]
    exception = next(e for e in recorder.events if e.kind == "exception")
    assert exception.detail == {"type": "RuntimeError", "message": FX_ERROR, "holder": "the-holder"}


@pytest.mark.timeout(120)
def test_a_stuck_flag_is_blamed_on_the_trace_that_restored_it(recorder):
    fn = torch.compile(lambda t: t - 1, backend="eager")
    fn(torch.ones(1))
    disturb.leave_fx_flag_stuck(names=("first", "second"))
    assert recorder.stuck_by == "second"
    assert [e.thread for e in recorder.events if e.kind == "stuck-flag"] == ["second"]
    with pytest.raises(RuntimeError, match="Detected that you are using FX"):
        with recorder.step(3):
            fn(torch.ones(1))
    [blame] = recorder.blames
    assert (blame.victim, blame.holder, blame.kind) == (threading.current_thread().name, "second", "stuck-flag")


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # pytest's hook, chained to
def test_uncaught_thread_exceptions_are_logged_with_the_thread_name(recorder):
    def boom():
        raise KeyError("cache")

    in_thread(boom, "drafter-0")
    [event] = [e for e in recorder.events if e.kind == "exception"]
    assert (event.thread, event.detail["type"], event.detail["message"]) == ("drafter-0", "KeyError", "'cache'")


def test_chrome_trace_has_metadata_slices_and_instants_per_thread(tmp_path):
    clock = iter([0.0, 0.5, 1.0, 1.25, 2.0]).__next__
    recorder = runtime.FlightRecorder(clock=clock)
    recorder.record(RecorderEventKind.STEP, "B", index=0)
    recorder.record(RecorderEventKind.EXCEPTION, "I", type="RuntimeError", message="x", holder="h")
    recorder.record(RecorderEventKind.STEP, "E", index=0)
    path = tmp_path / "trace.json"
    as_dicts = [e.to_dict() for e in recorder.events]
    write_chrome_trace(path, [("3 threads", recorder.events), ("single-thread", as_dicts)])
    doc = json.loads(path.read_text())
    events = doc["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "B", "E", "i"}
    assert all({"ph", "ts", "tid", "pid"} <= set(e) for e in events if e["ph"] != "M")
    names = [(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"]
    assert names == [(1, "3 threads"), (2, "single-thread")]
    slices = [(e["ph"], e["ts"], e["name"]) for e in events if e["pid"] == 1 and e["ph"] != "M"]
    assert slices == [("B", 500000.0, "step 0"), ("i", 1000000.0, "RuntimeError"), ("E", 1250000.0, "step 0")]
    me = threading.current_thread()
    assert {"name": "thread_name", "ph": "M", "pid": 1, "tid": me.ident, "args": {"name": me.name}} in events
    assert chrome_trace([])["traceEvents"] == []
