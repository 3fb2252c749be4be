"""runtime/thread_config.py on the installed torch, with real threads and real Dynamo compiles: what a thread
started later reads, the per-thread form, and run's check of a worker that compiled without its starter's value.
Each test starts its own "starter" thread, so nothing assigned here stays in the test process's main context."""
from __future__ import annotations

import threading

import pytest

from dflash_doctor.compile_settings import per_thread

LIMIT = "torch._dynamo.config.recompile_limit"


def _in_thread(target, name="starter"):
    box = {}

    def run():
        box["value"] = target()

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join(60)
    return box.get("value")


def _release():
    torch = pytest.importorskip("torch")
    return tuple(int(p) for p in torch.__version__.split(".")[:2])


def test_the_storage_read_from_the_live_config_matches_the_release():
    from dflash_doctor.runtime import thread_config

    assert thread_config.per_thread_storage("torch._dynamo.config") is per_thread(_release())


@pytest.mark.timeout(60)
def test_the_per_thread_form_sets_this_thread_only_and_gives_its_value_back():
    from dflash_doctor.runtime import thread_config

    default = thread_config.read(LIMIT)

    def starter():
        seen = {}
        with thread_config.in_this_thread({LIMIT: default + 5}):
            seen["inside"] = thread_config.read(LIMIT)
            seen["other"] = _in_thread(lambda: thread_config.read(LIMIT), "other")
        seen["after"] = thread_config.read(LIMIT)
        return seen

    seen = _in_thread(starter)
    if per_thread(_release()):
        assert seen == {"inside": default + 5, "other": default, "after": default}
    else:  # process-wide: the value reaches every thread and stays (leaving would switch it off for the others)
        assert seen["inside"] == seen["other"] == seen["after"] == default + 5


@pytest.mark.timeout(120)
def test_the_watch_names_a_worker_that_compiled_without_its_starters_value_and_not_one_that_set_it():
    torch = pytest.importorskip("torch")
    from dflash_doctor.runtime import thread_config

    gaps = []
    undo = thread_config.watch(gaps.append)
    try:
        default = thread_config.read(LIMIT)

        def compile_once(own_value):
            if own_value:
                thread_config.set_in_this_thread({LIMIT: default + 7})
            torch._dynamo.reset()
            torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(3))

        def starter():
            # both workers alive until both compiled (torch 2.11's CPU build crashed compiling in a thread started
            # after a compiling thread had ended, with or without this tool)
            thread_config.set_in_this_thread({LIMIT: default + 7})
            first_done, stop = threading.Event(), threading.Event()

            def first():
                compile_once(False)
                first_done.set()
                stop.wait(60)

            holder = threading.Thread(target=first, name="worker-default")
            holder.start()
            first_done.wait(60)
            _in_thread(lambda: compile_once(True), "worker-own")
            stop.set()
            holder.join(60)

        _in_thread(starter)
    finally:
        undo()
    found = [(g.thread, g.key, g.reads, g.starter, g.starter_reads) for g in gaps]
    if per_thread(_release()):
        assert found == [("worker-default", LIMIT, repr(default), "starter", repr(default + 7))]
    else:
        assert found == []
