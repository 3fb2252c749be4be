"""Progress on stderr: what the reporters write for each event, the heartbeat while tasks run silently, and the
events the repro harness sends (with a fake runner); the guards probes' progress is read from the real run in
tests/guards/test_command.py."""
from __future__ import annotations

import io

from dflash_doctor.progress import EventKind, ProgressEvent
from dflash_doctor.render.progress_view import LineReporter, line_for, reporting


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def event(kind, key, text=None, at_s=0.0):
    return ProgressEvent(kind, key, key if text is None else text, at_s)


def test_lines_name_the_task_its_outcome_and_the_one_time():
    assert line_for("repro", event(EventKind.STARTED, "natural trial 1/3 (mitigation none)", at_s=1.25)) == \
        "repro [    1.2s] natural trial 1/3 (mitigation none): started"
    assert line_for("repro", event(EventKind.FINISHED, "natural trial 1/3 (mitigation none)",
                                   "reproduced (fx-flag-leak)", at_s=25.72)) == \
        "repro [   25.7s] natural trial 1/3 (mitigation none): reproduced (fx-flag-leak)"
    assert line_for("guards", event(EventKind.NOTE, "note", "note: no flex backward on a CPU", 0.5)) == \
        "guards [    0.5s] note: no flex backward on a CPU"


def test_a_control_character_in_a_task_cannot_drive_the_terminal():
    assert "\x1b" not in line_for("repro", event(EventKind.NOTE, "note", "bad \x1b[2J name"))


def test_the_heartbeat_says_what_still_runs_after_a_silence_and_only_then():
    clock, out = FakeClock(), io.StringIO()
    lines = LineReporter("repro", out, clock=clock, heartbeat_s=15)
    lines(event(EventKind.STARTED, "natural trial 1/3 (mitigation none)", at_s=2.0))
    clock.now += 10
    lines.beat()
    assert out.getvalue().count("\n") == 1  # 10 s of silence: nothing yet
    clock.now += 6
    lines.beat()
    assert out.getvalue().splitlines()[-1] == \
        "repro [   18.0s] running: natural trial 1/3 (mitigation none) for 16 s"
    lines(event(EventKind.FINISHED, "natural trial 1/3 (mitigation none)", "not reproduced (ok)", at_s=40.0))
    clock.now += 60
    lines.beat()  # nothing runs: no heartbeat
    assert out.getvalue().splitlines()[-1].endswith("natural trial 1/3 (mitigation none): not reproduced (ok)")


def test_quiet_writes_nothing_and_a_file_gets_plain_lines():
    out = io.StringIO()
    with reporting("repro", quiet=True, stream=out) as progress:
        progress(event(EventKind.NOTE, "note", "hello"))
    assert out.getvalue() == ""
    with reporting("repro", stream=out) as progress:
        progress(event(EventKind.NOTE, "note", "hello", 3.0))
    assert out.getvalue() == "repro [    3.0s] hello\n"


def test_the_harness_reports_every_trial_i_of_k_and_one_time_per_trial():
    from tests.repro.test_harness import EVERYTHING_RUNS, FakeRunner, leak, ok

    from dflash_doctor.render.repro_view import verdict_words
    from dflash_doctor.repro.harness import run_repro
    from dflash_doctor.repro.spec import ReproSpec

    events = []
    ticks = iter(range(1000))
    report = run_repro(ReproSpec(trials=2), runner=FakeRunner(lambda s: leak(s) if s["mode"] == "forced" else ok(s)),
                       progress=events.append, clock=lambda: float(next(ticks)), capabilities=EVERYTHING_RUNS,
                       poll_s=0.001)
    started = [e.key for e in events if e.kind is EventKind.STARTED]
    finished = {e.key: e for e in events if e.kind is EventKind.FINISHED}
    assert started[0] == "single-thread control"
    assert "natural trial 1/2 (mitigation none)" in started and "natural trial 2/2 (mitigation none)" in started
    assert set(started) == set(finished)  # every task that starts is said to end
    forced = finished["forced trial 1/1 (mitigation none)"]
    assert forced.text == "reproduced (fx-flag-leak)"
    # the one time of the reproducing trial's end: the progress line's, the JSON's and the verdict's
    assert report.facts["time_to_verdict_s"] == forced.at_s
    assert verdict_words(report.facts).endswith(f"first at {forced.at_s:.1f} s")
    assert verdict_words(report.facts).startswith("reproduced (fx-flag-leak) under forced stress, 1/1 trials")


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_the_live_display_with_every_ended_task_printed_above_it():
    from dflash_doctor.render.progress_view import LiveReporter

    out = FakeTerminal()
    with reporting("repro", stream=out) as progress:
        assert isinstance(progress, LiveReporter)
        progress(event(EventKind.STARTED, "natural trial 1/3 (mitigation none)", at_s=0.5))
        progress(event(EventKind.FINISHED, "natural trial 1/3 (mitigation none)", "not reproduced (ok)", 9.0))
        assert progress.tasks.running == {}
    assert "repro [    9.0s] natural trial 1/3 (mitigation none): not reproduced (ok)" in out.getvalue()
