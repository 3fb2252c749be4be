"""What threads run, as a service (scan/thread_reach.py), and the rules that ask it: compiled callables handed to a
thread's target, DataParallel's replica threads, the Trainer under DataParallel, the backend's part in DFD201's
severity, and compile settings that never reach threads started later (torch >= 2.12)."""
from __future__ import annotations

import textwrap
from typing import List

import pytest

from dflash_doctor.findings import Finding, Severity
from dflash_doctor.rules.scan import COMPILED_CALL_IN_THREAD, SCAN_RULES
from dflash_doctor.scan import scan_source
from dflash_doctor.scan.analysis import CHECK_CLASSES
from dflash_doctor.scan.fixes import MARKERS
from dflash_doctor.scan.in_thread import COLLECTORS
from dflash_doctor.scan.thread_reach import IN_THREAD_CHECKS, InThreadCheck, ThreadReach


def found(source: str, code: str) -> List[Finding]:
    return [f for f in scan_source(textwrap.dedent(source)) if f.code == code]


# -- the registry ------------------------------------------------------------------------------------------------

def test_every_in_thread_check_reports_a_declared_rule_and_every_thread_rule_has_one():
    assert set(IN_THREAD_CHECKS) <= set(SCAN_RULES)
    spawning = {code for code, entry in SCAN_RULES.items() if "threads.SpawnCollector" in entry.checks}
    assert spawning == set(IN_THREAD_CHECKS)
    for check in COLLECTORS:
        assert CHECK_CLASSES[f"{check.__module__.rpartition('.')[2]}.{check.__name__}"] is check


def test_the_engine_asks_the_registry_for_in_thread_checks(monkeypatch):
    # a check swapped in for DFD201 is what the scan runs: the engine names no rule of its own
    class EveryThreadRunningClose(InThreadCheck):
        rule = COMPILED_CALL_IN_THREAD

        def check(self, thread: ThreadReach) -> List[Finding]:
            runs_close = any(name.endswith("close") for _, name in thread.functions())
            return [self.rule.finding("closes", path=thread.path, line=thread.spawn.line,
                                      column=thread.spawn.column)] if runs_close else []

    monkeypatch.setitem(IN_THREAD_CHECKS, COMPILED_CALL_IN_THREAD.code, EveryThreadRunningClose())
    source = """\
        import threading

        def close():
            pass

        def worker():
            close()

        threading.Thread(target=worker).start()
        threading.Thread(target=print).start()
    """
    assert [(f.line, f.message) for f in found(source, "DFD201")] == [(9, "closes")]


# -- compiled callables handed to the target ---------------------------------------------------------------------

HANDED = textwrap.dedent("""\
    import functools
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from multiprocessing.pool import ThreadPool
    import torch

    model = torch.compile(torch.nn.Linear(4, 4))


    def step(net, x):
        return net(x)


    def worker(net, x=None):
        return step(net, x)


    def keyword_worker(x, *, net):
        return net.forward(x)


    def saver(net, path):
        torch.save(net.state_dict(), path)


    pool = ThreadPoolExecutor(4)
    threads = ThreadPool(2)
    bound = functools.partial(worker, model)
""")


@pytest.mark.parametrize("spawn", [
    "threading.Thread(target=worker, args=(model,))",
    "threading.Thread(None, worker, 'w', (model, 1))",
    "threading.Thread(target=worker, kwargs={'net': model})",
    "threading.Thread(target=worker, kwargs=dict(net=model))",
    "threading.Timer(1.0, worker, args=(model,))",
    "threading.Thread(target=functools.partial(worker, model))",
    "threading.Thread(target=bound)",
    "threading.Thread(target=keyword_worker, args=(1,), kwargs={'net': model})",
    "pool.submit(worker, model, 1)",
    "pool.submit(keyword_worker, 1, net=model)",
    "pool.map(worker, [model, model])",
    "pool.map(functools.partial(worker, x=1), [model])",
    "threads.apply_async(worker, (model,))",
    "threads.apply_async(keyword_worker, (1,), {'net': model})",
])
def test_a_compiled_argument_the_target_calls_is_followed(spawn):
    findings = found(HANDED + spawn + "\n", "DFD201")
    assert len(findings) == 1, spawn
    assert findings[0].evidence["argument"] in ("model", "an element of [model, model]", "an element of [model]")
    assert findings[0].evidence["chain"][-1].startswith("model (<string>:7)")


@pytest.mark.parametrize("spawn", [
    "threading.Thread(target=saver, args=(model, 'ckpt.pt'))",  # handed over to be saved, never called
    "threading.Thread(target=print, args=(model,))",  # a function outside the project
    "pool.submit(saver, model, 'ckpt.pt')",
    "threading.Thread(target=worker, args=(*[model],))",  # positions after a star are unknown
])
def test_an_argument_the_target_does_not_call_is_not_followed(spawn):
    assert found(HANDED + spawn + "\n", "DFD201") == []


def test_processes_get_their_own_dynamo_state_and_are_not_followed():
    source = """\
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        import torch

        model = torch.compile(torch.nn.Linear(4, 4))

        def evaluate(net, x):
            return net(x)

        with ProcessPoolExecutor(2) as pool:
            pool.submit(evaluate, model, 1)
        mp.Process(target=evaluate, args=(model, 1)).start()
    """
    assert scan_source(textwrap.dedent(source)) == []


def test_an_attribute_of_an_object_handed_over_is_followed():
    source = """\
        import threading
        import torch

        class Job:
            def __init__(self, model, steps):
                self.model = model
                self.steps = steps

        def run(job):
            for _ in range(job.steps):
                job.model(torch.randn(2, 4))

        def count(job):
            return job.steps

        job = Job(torch.compile(torch.nn.Linear(4, 4)), 3)
        threading.Thread(target=run, args=(job,)).start()
        threading.Thread(target=count, args=(job,)).start()
    """
    [finding] = found(source, "DFD201")
    assert finding.line == 17 and finding.evidence["argument"] == "job.model"


def test_a_module_compiled_in_place_and_handed_over_is_followed():
    source = """\
        import threading
        import torch

        class Net(torch.nn.Module):
            def forward(self, x):
                return x * 2

        def train(net):
            for _ in range(3):
                net(torch.ones(2))

        net = Net()
        net.compile()
        threading.Thread(target=train, args=(net,)).start()
    """
    [finding] = found(source, "DFD201")
    assert finding.line == 14 and finding.evidence["compiled"]["line"] == 13


# -- the backend -------------------------------------------------------------------------------------------------

BACKEND = """\
    import threading
    import torch

    step = torch.compile(lambda x: x * 2{backend})

    def worker(x):
        return step(x)

    threading.Thread(target=worker, args=(1,)).start()
"""


@pytest.mark.parametrize("backend,severity", [
    ("", Severity.ERROR), (", backend='inductor'", Severity.ERROR), (", backend='aot_eager'", Severity.ERROR),
    (", backend='cudagraphs'", Severity.ERROR), (", backend=my_backend", Severity.ERROR),
    (", backend='eager'", Severity.WARNING), (", backend='eager_noexcept'", Severity.WARNING),
])
def test_dfd201_severity_follows_the_backend(backend, severity):
    [finding] = found(BACKEND.format(backend=backend), "DFD201")
    assert finding.severity is severity
    assert ("does not trace with FX" in finding.message) is (severity is Severity.WARNING)


def test_a_decorated_eager_function_is_a_warning_too():
    source = """\
        import threading
        import torch

        @torch.compile(backend="eager", fullgraph=True)
        def step(x):
            return x * 2

        threading.Thread(target=lambda: step(1)).start()
    """
    [finding] = found(source, "DFD201")
    assert finding.severity is Severity.WARNING and finding.evidence["backend"] == "eager"


@pytest.mark.timeout(120)
def test_the_eager_backend_runs_no_fx_trace_and_aot_eager_does(monkeypatch):
    # the claim behind the table, on the installed torch: count Tracer.trace while compiling and calling
    torch = pytest.importorskip("torch")
    import torch.fx

    traces = []
    original = torch.fx.Tracer.trace

    def counting(self, *args, **kwargs):
        traces.append(type(self).__name__)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.fx.Tracer, "trace", counting)
    torch._dynamo.reset()
    x = torch.randn(4, 4, requires_grad=True)
    torch.compile(lambda t: (t.sin() * 2).sum(), backend="eager")(x).backward()
    assert traces == []
    torch.compile(lambda t: (t.cos() * 3).sum(), backend="aot_eager")(x).backward()
    assert traces, "aot_eager traces with make_fx (a Tracer)"
    torch._dynamo.reset()


# -- DataParallel and parallel_apply ----------------------------------------------------------------------------

REPLICAS = textwrap.dedent("""\
    import torch
    from torch import nn
    from torch.nn.parallel import data_parallel, parallel_apply

    attend = torch.compile(lambda q: q * 2)

    class Block(nn.Module):
        def forward(self, x):
            return attend(x)

    class Mlp(nn.Module):
        def forward(self, x):
            return x

    compiled = torch.compile(Mlp())
""")


@pytest.mark.parametrize("line,severity", [
    ("nn.DataParallel(compiled, device_ids=[0, 0, 0])", Severity.ERROR),
    ("torch.nn.parallel.DataParallel(module=torch.compile(Mlp()))", Severity.ERROR),
    ("data_parallel(compiled, torch.randn(2))", Severity.ERROR),
    ("nn.DataParallel(Block())", Severity.WARNING),
    ("parallel_apply([compiled, compiled], [(1,), (2,)])", Severity.WARNING),
    ("parallel_apply([Block() for _ in range(2)], [(1,), (2,)])", Severity.WARNING),
])
def test_replica_threads_over_compiled_code(line, severity):
    [finding] = found(REPLICAS + line + "\n", "DFD204")
    assert finding.severity is severity
    assert found(REPLICAS + line + "\n", "DFD201") == []  # one finding per site: DFD204 judges replica threads


@pytest.mark.parametrize("lines", [
    "torch.compile(nn.DataParallel(Mlp()))",
    "dp = nn.DataParallel(Mlp())\ndp = torch.compile(dp)",
    "dp = nn.DataParallel(Mlp())\ndp.compile()",
    "nn.DataParallel(Mlp())",
    "nn.parallel.DistributedDataParallel(compiled)",
    "class DataParallel:\n    def __init__(self, m):\n        pass\nDataParallel(compiled)",
])
def test_what_holds_or_is_not_dataparallel_is_not_reported(lines):
    assert found(REPLICAS + lines + "\n", "DFD204") == []


# -- the Trainer -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("source,expected", [
    ("from transformers import TrainingArguments\nTrainingArguments('o', torch_compile=True)\n", [2]),
    ("import trl\ntrl.SFTConfig(output_dir='o', torch_compile=True)\n", [2]),
    ("from transformers import TrainingArguments\nTrainingArguments('o', torch_compile=False)\n", []),
    ("import os\nfrom transformers import TrainingArguments\nrank = int(os.environ['LOCAL_RANK'])\n"
     "TrainingArguments('o', torch_compile=True)\n", []),
    ("class TrainingArguments:\n    pass\nTrainingArguments(torch_compile=True)\n", []),  # the project's own
    ("import torch\nfrom transformers import Trainer\nm = torch.compile(model)\nTrainer(model=m, args=a)\n", [4]),
    ("import torch\nfrom trl import SFTTrainer\nSFTTrainer(torch.compile(model), args=a)\n", [3]),
    ("import torch\nfrom transformers import Trainer\nTrainer(model=model, args=a)\n", []),
    ("import torch\nfrom transformers import Trainer\nTrainer(model=torch.compile(model))\nLOCAL_RANK = 0\n", []),
])
def test_trainer_compile_without_a_launcher(source, expected):
    assert [f.line for f in found(source, "DFD205")] == expected


# -- compile settings that do not reach threads started later --------------------------------------------------

SETTINGS = """\
    import threading
    import torch
    import torch._dynamo
    import torch._functorch.config
    from dflash_doctor import runtime

    {main}
    step = torch.compile(lambda x: x * 2)

    def worker(x):
        {inside}
        return step(x)

    def logger():
        print("alive")

    threading.Thread(target=worker, args=(1,)).start()  # noqa: DFD201
    threading.Thread(target=logger).start()
"""


@pytest.mark.parametrize("main,inside,lines", [
    ("torch._dynamo.config.recompile_limit = 64", "pass", [7]),
    ("torch._functorch.config.force_non_lazy_backward_lowering = True", "pass", [7]),
    ("setattr(torch._dynamo.config, 'error_on_nested_fx_trace', False)", "pass", [7]),
    ("torch._dynamo.config.error_on_nested_fx_trace = True", "pass", []),  # the default: nothing relied on
    ("torch._functorch.config.force_non_lazy_backward_lowering = False", "pass", []),
    ("pass", "torch._dynamo.config.recompile_limit = 64", []),  # the worker sets its own
    ("torch._dynamo.config.suppress_errors = True", "pass", []),  # not a setting of compile_settings.py
    # the tool's runtime API carries the switch into threads started later
    ("torch._functorch.config.force_non_lazy_backward_lowering = True\nruntime.enable_non_lazy_backward()",
     "pass", []),
    # ... but not a recompile limit, which no registry fix switches
    ("torch._dynamo.config.recompile_limit = 64\nruntime.enable_non_lazy_backward()", "pass", [7]),
])
def test_a_setting_assigned_outside_the_threads(main, inside, lines):
    source = SETTINGS.format(main=main.replace("\n", "\n    "), inside=inside)
    findings = found(source, "DFD303")
    assert [f.line for f in findings] == lines
    for finding in findings:
        assert [t["target"] for t in finding.evidence["threads"]] == ["worker"]  # the logger runs no compiled code
        assert "from torch 2.12" in finding.message


@pytest.mark.skipif("non_lazy_backward_in_thread" not in MARKERS,
                    reason="the runtime's per-thread form of non-lazy-backward is not in the registry yet")
def test_the_per_thread_form_entered_in_the_worker_reaches_it():
    source = SETTINGS.format(main="torch._functorch.config.force_non_lazy_backward_lowering = True",
                             inside="pass").replace(
        "        return step(x)\n", "        with runtime.non_lazy_backward_in_thread():\n            return step(x)\n")
    assert found(source, "DFD303") == []


@pytest.mark.skipif("non_lazy_backward_in_thread" not in MARKERS,
                    reason="the runtime's per-thread form of non-lazy-backward is not in the registry yet")
@pytest.mark.parametrize("where,mitigated", [("worker", True), ("main", False)])
def test_a_runtime_form_entered_with_with_counts_only_in_the_thread_that_enters_it(where, mitigated):
    form = "with runtime.non_lazy_backward_in_thread():\n"
    worker = (f"def worker(x):\n    {form}        return step(x)\n" if where == "worker"
              else "def worker(x):\n    return step(x)\n")
    main = f"{form}    pass\n" if where == "main" else ""
    source = ("import threading\nimport torch\nfrom dflash_doctor import runtime\n"
              "runtime.install_threadlocal_fx_flag()\nstep = torch.compile(lambda x: x)\n" + worker + main
              + "threading.Thread(target=worker, args=(1,)).start()\n")
    [finding] = found(source, "DFD201")
    assert (finding.severity is Severity.INFO) is mitigated
