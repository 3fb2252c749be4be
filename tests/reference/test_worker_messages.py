"""The messages a rank of `pipeline --workers processes` sends its parent (reference/worker_messages.py): written by
a real spawned child through the rank's own Outbox and read back by the parent's decode, and refused, each with a
reason naming the sender, when they are not what this version reads."""
from __future__ import annotations

import ast
import multiprocessing
import os
import time
from pathlib import Path
from typing import List

import pytest

from dflash_doctor.reference.results import Outcome, StepRecord, WorkerOutcome
from dflash_doctor.reference.worker_messages import (
    MESSAGE_TYPES, MESSAGES_VERSION, Blame, Corpus, Ended, MessageError, MessageKind, Phase, Ready, Received, Step,
    TargetForward, Threads, TransportFallback, decode, encode,
)

CHILD_TIMEOUT_S = 60.0  # a spawned interpreter imports the package: a few seconds on the 2-core box


def sample_messages():
    """One message of every kind, as a drafter rank says them in a run that fails at its third step."""
    outcome = WorkerOutcome("drafter-0", "drafter", "cpu", Outcome.ERROR, "RuntimeError: boom", steps=2,
                            traceback="Traceback (most recent call last):\n...\nRuntimeError: boom\n",
                            phase="training", wait_s=0.25, switches={"error_on_nested_fx_trace": "False"})
    frame = {"file": "torch/fx/_symbolic_trace.py", "line": 812, "function": "trace",
             "source": "fn_globals = fn.__globals__"}
    blame = {"victim": "drafter-0", "holder": "drafter-1", "at_s": 1.5, "kind": "fx-flag-leak",
             "error": "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized "
                      "function.", "holder_stack": [frame], "trace_start": [frame], "victim_stack": []}
    corpus = {"sequences": 64, "prompt_len": 8, "seq_len": 32, "seconds": 0.4, "decode": "eager",
              "eager_reason": "a CPU has no CUDA graphs"}
    return [
        Phase("building drafter-0 on cpu"),
        Ready(),
        Threads({1234: "drafter-0", 5678: "parent-watch"}),
        Corpus(corpus),
        TargetForward("eager (a CPU has no CUDA graphs)"),
        TransportFallback("target-0 -> drafter-0: CUDA IPC unusable (RuntimeError: no IPC); gloo instead"),
        Step(StepRecord(step=1, worker="drafter-0", loss=3.25, tokens=512, seconds=0.125, finished_at=17.5)),
        Step(StepRecord(step=2, worker="drafter-0", loss=2.5, tokens=512, seconds=0.1, finished_at=17.75)),
        Blame([blame]),
        Ended(outcome),
    ]


def _say_everything(queue) -> None:
    """The child: every sample message through a rank's own Outbox, then its flush (as before a SIGKILL)."""
    from dflash_doctor.reference.workers_processes import Outbox

    outbox = Outbox(queue, "drafter-0")
    for message in sample_messages():
        outbox.put(message)
    outbox.flush()


def _put_raw(queue, raw) -> None:
    """The child: an envelope written by hand (what another version, or a broken encoder, would put)."""
    queue.put(raw)
    queue.close()
    queue.join_thread()


def _in_child(target, *args):
    """Start `target(queue, *args)` in a spawned child (as the ranks are started) and return (queue, process)."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=target, args=(queue, *args))
    process.start()
    return queue, process


def _end(process) -> None:
    process.join(CHILD_TIMEOUT_S)
    if process.is_alive():  # it never put what the test waited for: do not leave it behind
        process.kill()
        process.join(5)


@pytest.mark.timeout(90)
def test_every_message_a_child_writes_reads_back_equal_in_the_parent():
    queue, process = _in_child(_say_everything)
    try:
        received = [decode(queue.get(timeout=CHILD_TIMEOUT_S), ["target-0", "drafter-0"])
                    for _ in sample_messages()]
    finally:
        _end(process)
    assert process.exitcode == 0
    assert received == [Received("drafter-0", message) for message in sample_messages()]
    assert {type(r.message).KIND for r in received} == set(MessageKind)  # every kind crossed, each once at least


def test_every_kind_has_one_message_class():
    assert sorted(cls.KIND.value for cls in MESSAGE_TYPES) == sorted(kind.value for kind in MessageKind)


def _refusal(raw) -> MessageError:
    with pytest.raises(MessageError) as caught:
        decode(raw, ["target-0", "drafter-0"])
    return caught.value


def test_an_unknown_kind_is_refused_naming_it_and_the_sender():
    error = _refusal((MESSAGES_VERSION, "drafter-0", "stepped", {"record": None}))
    assert (error.sender, error.reason) == ("drafter-0", "a message of unknown kind 'stepped'")
    assert str(error) == "drafter-0 sent a message its parent cannot read: a message of unknown kind 'stepped'"


def test_a_missing_field_is_refused_not_defaulted():
    error = _refusal((MESSAGES_VERSION, "target-0", MessageKind.PHASE.value, {}))
    assert (error.sender, error.reason) == ("target-0", "a phase message without text")


def test_a_renamed_field_is_refused_as_missing_and_an_extra_one_as_unknown():
    _, envelope_fields = encode("drafter-0", Phase("training"))[2:]
    renamed = {"phase": envelope_fields["text"]}
    assert _refusal((MESSAGES_VERSION, "drafter-0", "phase", renamed)).reason == "a phase message without text"
    extra = {**envelope_fields, "worker": "drafter-0"}
    assert _refusal((MESSAGES_VERSION, "drafter-0", "phase", extra)).reason == (
        "a phase message with fields this version does not know: worker")


def test_a_field_of_the_wrong_type_is_refused():
    step = {"record": (1, "drafter-0", 2.5, 512, 0.1, 17.5)}  # the record's values, not the record
    assert _refusal((MESSAGES_VERSION, "drafter-0", "step", step)).reason == "a step message whose record is a tuple"


def test_another_version_an_unknown_sender_and_a_bare_tuple_are_refused():
    other = _refusal((MESSAGES_VERSION + 1, "drafter-0", "ready", {}))
    assert other.reason == (f"a message of version {MESSAGES_VERSION + 1}; "
                            f"this dflash-doctor reads version {MESSAGES_VERSION}")
    stranger = _refusal((MESSAGES_VERSION, "drafter-7", "ready", {}))
    assert (stranger.sender, stranger.reason) == (None, "a message from 'drafter-7', not a rank of this run")
    # the shape every message had before this codec: a tuple whose first word is the kind
    old = _refusal(("step", StepRecord(1, "drafter-0", 2.5, 512, 0.1, 17.5)))
    assert old.sender is None and old.reason.startswith("not a message envelope: tuple ('step', StepRecord(")


@pytest.mark.timeout(90)
def test_a_message_the_parent_cannot_read_ends_the_run_with_its_sender_failed_and_the_reason():
    pytest.importorskip("torch")  # the plan reads the devices through torch
    from dflash_doctor.reference.pipeline import PipelineOptions, make_plan
    from dflash_doctor.reference.results import Progress
    from dflash_doctor.reference.signals import StopRequest
    from dflash_doctor.reference.workers_processes import ProcessRun

    plan = make_plan(PipelineOptions(workers="processes", target_devices="cpu", drafter_devices="cpu"))
    run = ProcessRun(plan, Progress(), time.monotonic, StopRequest())
    os.rmdir(run.workdir)  # nothing is started: no stacks are dumped there
    renamed = {"recrod": StepRecord(1, "drafter-0", 2.5, 512, 0.1, 17.5)}
    run.outbox, process = _in_child(_put_raw, (MESSAGES_VERSION, "drafter-0", MessageKind.STEP.value, renamed))
    try:
        assert run.take(CHILD_TIMEOUT_S) is True
    finally:
        _end(process)
    assert run.failed_worker == "drafter-0" and run.aggregator.losses == []
    outcome = run.outcome_of(1, "drafter-0", process)
    assert (outcome.outcome, outcome.error) == (
        Outcome.ERROR, "drafter-0 sent a message its parent cannot read: a step message without record")


@pytest.mark.timeout(30)
def test_a_message_from_no_rank_of_the_run_is_the_parents_own_failed_entry():
    pytest.importorskip("torch")
    from dflash_doctor.reference.pipeline import PipelineOptions, make_plan
    from dflash_doctor.reference.results import Progress
    from dflash_doctor.reference.signals import StopRequest
    from dflash_doctor.reference.workers_processes import ProcessRun

    plan = make_plan(PipelineOptions(workers="processes", target_devices="cpu", drafter_devices="cpu"))
    run = ProcessRun(plan, Progress(), time.monotonic, StopRequest())
    run.unreadable(_refusal(("step", StepRecord(1, "drafter-0", 2.5, 512, 0.1, 17.5))))
    result = run.collect()  # no rank was started: the parent's entry is the only one
    assert result.failed_worker == "parent" and not result.ok
    [parent] = [w.to_dict() for w in result.workers]
    assert (parent["name"], parent["role"], parent["outcome"]) == ("parent", "parent", "error")
    assert parent["error"].startswith("a rank sent a message its parent cannot read: not a message envelope: tuple")


REFERENCE = Path(__file__).resolve().parents[2] / "dflash_doctor" / "reference"
KIND_WORDS = {kind.value for kind in MessageKind} | {"outcome", "target_forward", "transport_fallback", "flush"}


def _reads_by_word(tree: ast.AST) -> List[str]:
    """A message told apart by a word outside the codec: `message[0] == "step"`, `kind == "phase"`."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        words = [s.value for s in sides if isinstance(s, ast.Constant) and s.value in KIND_WORDS]
        by_position = any(isinstance(s, ast.Subscript) and isinstance(s.slice, ast.Constant) and s.slice.value == 0
                          for s in sides)
        by_kind = any(isinstance(s, ast.Name) and s.id == "kind" for s in sides)
        if words and (by_position or by_kind):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_of_the_pipeline_tells_a_message_apart_by_its_word():
    offences = [f"{path.name} {hit}" for path in sorted(REFERENCE.glob("*.py")) if path.name != "worker_messages.py"
                for hit in _reads_by_word(ast.parse(path.read_text("utf-8")))]
    assert offences == [], "read a rank's message through worker_messages.decode and its classes"


def test_the_word_scan_finds_what_the_parent_used_to_do():
    before = '''
def take(self, message):
    kind = message[0]
    if kind == "step":
        self.aggregator.add(message[1])
    elif kind == "phase":
        self.phases[message[1]] = message[2]


def emit(message):
    if message[0] == "flush":
        outbox.close()
'''
    assert sorted(_reads_by_word(ast.parse(before))) == ["line 11: message[0] == 'flush'", "line 4: kind == 'step'",
                                                         "line 6: kind == 'phase'"]
