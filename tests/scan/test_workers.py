"""The forked two-pass workers (scan/workers.py): real forks, real pipes."""
from __future__ import annotations

import os

import pytest

from dflash_doctor.scan import workers

pytestmark = pytest.mark.skipif(not workers.fork_usable(), reason="needs fork in a single-threaded process")


def test_each_worker_runs_its_share_then_the_piece_planned_from_every_first_result():
    seen_plans = []

    def plan(firsts):
        seen_plans.append(firsts)
        total = sum(firsts)
        return [total * 10, total * 100]

    firsts, seconds = workers.two_passes([[1, 2], [3, 4, 5]], first=sum, plan=plan,
                                         second=lambda piece: (piece, os.getpid()))
    assert firsts == [3, 12] and seen_plans == [[3, 12]]
    assert [piece for piece, _ in seconds] == [150, 1500]
    pids = {pid for _, pid in seconds}
    assert os.getpid() not in pids and len(pids) == 2  # each ran in its own child


def test_large_answers_cross_the_pipe_whole():
    big = "x" * (3 << 20)  # larger than a pipe's buffer: the parent must read while the child writes
    firsts, seconds = workers.two_passes([0, 1], first=lambda i: big + str(i), plan=lambda f: [None, None],
                                         second=lambda piece: len(big))
    assert firsts == [big + "0", big + "1"] and seconds == [len(big)] * 2


@pytest.mark.parametrize("stage", ["first", "second"])
def test_a_worker_that_raises_is_reported_not_hung(stage):
    def boom(_):
        raise ValueError("bad input")

    first = boom if stage == "first" else (lambda share: share)
    second = boom if stage == "second" else (lambda piece: piece)
    with pytest.raises(workers.WorkerFailed, match="ValueError: bad input"):
        workers.two_passes([1, 2], first=first, plan=lambda f: [0, 0], second=second)


def test_a_worker_that_dies_is_reported():
    with pytest.raises(workers.WorkerFailed, match="ended without answering"):
        workers.two_passes([1], first=lambda share: os._exit(3), plan=lambda f: [0], second=lambda p: p)


def test_shared_items_are_each_taken_once_by_whichever_worker_is_free():
    # worker 0's piece is slow, so worker 1 (free first) takes the shared items; each is run exactly once
    def second(piece):
        if piece == "slow":
            import time

            time.sleep(0.5)
        return piece

    shared = list(range(40))
    firsts, answers = workers.two_passes(
        [0, 1], first=lambda share: share, plan=lambda f: (["slow", "fast"], shared),
        second=second, after=lambda item: (item * item, os.getpid()))
    assert [answer for answer, _ in answers] == ["slow", "fast"]
    taken = [(index, result) for _, items in answers for index, result in items]
    assert sorted(index for index, _ in taken) == shared
    assert all(square == index * index for index, (square, _) in taken)
    by_worker = [len(items) for _, items in answers]
    assert by_worker[1] > by_worker[0]  # the free worker did most of them


def test_shared_items_need_not_exist():
    firsts, answers = workers.two_passes([0, 1], first=lambda share: share, plan=lambda f: ([1, 2], []),
                                         second=lambda piece: piece, after=lambda item: item)
    assert answers == [(1, []), (2, [])]


def test_a_worker_that_dies_while_others_wait_for_shared_items_is_reported():
    def second(piece):
        if piece == 0:
            os._exit(3)
        return piece

    with pytest.raises(workers.WorkerFailed, match="ended without answering"):
        workers.two_passes([0, 1], first=lambda share: share, plan=lambda f: ([0, 1], list(range(5))),
                           second=second, after=lambda item: item)


def test_more_shared_items_than_a_pipe_holds_are_each_taken_once():
    # 20,000 indexes are 80 kB, more than a pipe's 64 kB buffer: the parent writes while the workers take
    shared = list(range(20_000))
    _, answers = workers.two_passes([0, 1], first=lambda share: share, plan=lambda f: ([0, 1], shared),
                                    second=lambda piece: piece, after=lambda item: item)
    taken = sorted(result for _, items in answers for index, result in items)
    assert taken == shared
