"""repro's non-lazy-backward row reaches its worker threads (compile settings are per thread from torch 2.12): on
the CPU, with a model whose forward and backward are compiled, each worker reads the switch and compiles no
backward lazily, while the single-thread control (run without the mitigation) compiles its backward at backward().
Real torch, real compiles, real threads."""
from __future__ import annotations

import json

import pytest

NON_LAZY = "torch._functorch.config.force_non_lazy_backward_lowering"


@pytest.mark.slow  # end to end, two cold compiles per thread on the CPU: `pytest -m slow`
@pytest.mark.timeout(560)
def test_the_non_lazy_backward_row_compiles_each_workers_backward_with_its_forward(cli, tmp_path):
    torch = pytest.importorskip("torch")
    from dflash_doctor.compile_settings import per_thread

    if not per_thread(tuple(int(p) for p in torch.__version__.split(".")[:2])):  # type: ignore[arg-type]
        pytest.skip("process-wide settings: torch 2.11's CPU build segfaults compiling this model's backward with "
                    "the forward in two live threads, with no dflash_doctor code loaded (docs/races.md)")
    out = tmp_path / "repro.json"
    proc = cli("repro", "--model", "tests.repro.mlp_factory:build", "--backward", "--threads", "2", "--device",
               "cpu", "--shapes", "per-thread", "--mode", "natural", "--steps", "1", "--trials", "1",
               "--mitigation", "non-lazy-backward", "-f", "json", "-o", out, timeout=540)
    facts = json.loads(out.read_text(encoding="utf-8"))["facts"]
    assert facts["multi_thread"]["outcome"] == "ok", proc.stderr[-2000:]
    control = facts["single_thread"]["threads"][0]
    assert control["lazy_backward_compiles"] == 1 and control["switches"] == {}  # the count sees a lazy compile
    workers = facts["multi_thread"]["threads"]
    assert [w["switches"] for w in workers] == [{NON_LAZY: "True"}] * 2
    # drafter-0's shape is the control's: its graphs come from the trial's compile cache, compiled by nobody here;
    # drafter-1's shape is new: compiled in the worker, backward with the forward
    assert workers[1]["name"] == "drafter-1" and workers[1]["lazy_backward_compiles"] == 0
    assert all(w["lazy_backward_compiles"] == 0 for w in workers)
