"""Rule behaviour on small sources: registry examples, alias resolution, partials, look-alikes, threads."""
from __future__ import annotations

import textwrap

import pytest

from dflash_doctor.scan import scan_source
from dflash_doctor.scan.engine import scan_rules

# Every rule with Python examples is a scan rule; iterate the scan table so another domain's table being
# mid-edit cannot hide these tests.
PYTHON_RULES = [rule for rule in scan_rules() if rule.example_format == "python"]


def codes_at(source: str) -> list:
    return [(f.line, f.code) for f in scan_source(textwrap.dedent(source))]


def marked_lines(source: str, code: str) -> list:
    return [(n, code) for n, line in enumerate(source.splitlines(), 1) if line.rstrip().endswith(f"# {code}")]


def test_every_scan_rule_has_python_examples():
    assert {r.code for r in PYTHON_RULES} >= {"DFD101", "DFD102", "DFD103", "DFD104", "DFD201", "DFD202", "DFD301"}


@pytest.mark.parametrize("rule", PYTHON_RULES, ids=lambda r: r.code)
def test_bad_example_fires_exactly_its_code_on_the_marked_line(rule):
    expected = marked_lines(rule.bad, rule.code)
    assert expected, f"{rule.code}'s bad example marks no line"
    assert codes_at(rule.bad) == expected


@pytest.mark.parametrize("rule", PYTHON_RULES, ids=lambda r: r.code)
def test_good_example_is_clean(rule):
    assert codes_at(rule.good) == []


@pytest.mark.parametrize("source,expected", [
    ("import torch.utils.checkpoint as tuc\ntuc.checkpoint(f, x)\n", [(2, "DFD102")]),
    ("from torch.utils import checkpoint as cp\ncp.checkpoint(f, x, use_reentrant=True)\n", [(2, "DFD101")]),
    ("from torch.utils.checkpoint import checkpoint as ckpt\nckpt(f, x, use_reentrant=v)\n", [(2, "DFD103")]),
    ("import torch\ntorch.utils.checkpoint.checkpoint(f, x)\n", [(2, "DFD102")]),
    ("import torch as t\nt.utils.checkpoint.checkpoint_sequential(m, 2, x, False)\n", []),
    ("from torch.utils.checkpoint import *\ncheckpoint(f, x, **kw)\n", [(2, "DFD103")]),
    ("from torch.utils.checkpoint import checkpoint\nckpt = checkpoint\nckpt(f, x)\n", [(3, "DFD102")]),
    ("import functools, torch\np = functools.partial(torch.utils.checkpoint.checkpoint)\np(f, x)\n", [(3, "DFD102")]),
    ("from functools import partial as P\nfrom torch.utils.checkpoint import checkpoint\n"
     "p = P(checkpoint, use_reentrant=True)\np(f, x)\n", [(3, "DFD101")]),
    ("from torch.utils.checkpoint import checkpoint\ncheckpoint(f, x, **{'use_reentrant': True})\n", [(2, "DFD101")]),
    ("from torch.utils.checkpoint import checkpoint\ncheckpoint(f, x, **dict(use_reentrant=False))\n", []),
])
def test_alias_and_partial_spellings(source, expected):
    assert codes_at(source) == expected


@pytest.mark.parametrize("source", [
    # weight checkpointing and look-alikes: never torch.utils.checkpoint
    "def checkpoint(state, path):\n    pass\ncheckpoint(s, 'p')\n",
    "class T:\n    def checkpoint(self, s):\n        pass\n    def save(self):\n        self.checkpoint(1)\n",
    "trainer.save_checkpoint('/workspace/checkpoints')\nupload_checkpoint_to_s3(p, k)\n",
    "from torch.utils.checkpoint import checkpoint\ndef checkpoint(state):\n    pass\ncheckpoint(s)\n",
    "from torch.utils.checkpoint import checkpoint\ndef f(checkpoint):\n    return checkpoint(g, x)\n",
    "import deepspeed\ndeepspeed.checkpointing.checkpoint(f, x)\n",
    "from mylib import checkpoint\ncheckpoint(f, x)\n",
    "import torch\ntorch.save(model.state_dict(), 'checkpoint.pt')\n",
])
def test_look_alikes_are_clean(source):
    assert codes_at(source) == []


def test_module_level_shadowing_is_ordered():
    source = """\
        from torch.utils.checkpoint import checkpoint
        checkpoint(f, x)  # real: before the local def
        def checkpoint(fn, x):
            return fn(x)
        checkpoint(f, x)
    """
    assert codes_at(source) == [(2, "DFD102")]


def test_global_declarations_resolve_to_the_module():
    source = """\
        global ckpt
        from torch.utils.checkpoint import checkpoint as ckpt
        def f(x):
            global ckpt
            return ckpt(g, x)
    """
    assert codes_at(source) == [(5, "DFD102")]


def test_noqa_suppresses_only_the_named_codes():
    source = """\
        from torch.utils.checkpoint import checkpoint
        checkpoint(f, x)  # noqa
        checkpoint(f, x)  # noqa: DFD102
        checkpoint(f, x)  # noqa: DFD101
        checkpoint(f, x)  # NOQA:DFD101,DFD102
        checkpoint(f, x, use_reentrant=False)  # noqa: DFD102, E501
    """
    # DFD101 is named where no DFD101 fires, and DFD102 where the call is fine: unused (DFD302), like RUF100;
    # the bare noqa and E501 are other tools' business.
    assert codes_at(source) == [(4, "DFD102"), (4, "DFD302"), (5, "DFD302"), (6, "DFD302")]
    unused = [(f.line, f.column, f.message) for f in scan_source(textwrap.dedent(source)) if f.code == "DFD302"]
    assert unused == [
        (4, 19, "`# noqa: DFD101` suppresses nothing: no DFD101 finding on this line"),
        (5, 19, "`# noqa: DFD101` suppresses nothing: no DFD101 finding on this line"),
        (6, 40, "`# noqa: DFD102` suppresses nothing: no DFD102 finding on this line"),
    ]


THREADS = """\
    import threading
    import torch
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    step = torch.compile(lambda x: x + 1)

    def eager(x):
        return x

    def level3(x):
        return step(x)

    def level2(x):
        return level3(x)

    def level1(x):
        return level2(x)

    class Model(torch.nn.Module):
        def forward(self, x):
            return x

    def run_processes(x):
        with ProcessPoolExecutor() as pool:
            return pool.submit(level1, x)

    threading.Thread(target=level1, args=(1,)).start()  # DFD201
    threading.Thread(target=eager).start()
    threading.Timer(1.0, step).start()  # DFD201
    run_processes(1)
    compiled_model = torch.compile(Model())
    ThreadPoolExecutor().submit(compiled_model, 1)  # DFD201
    ThreadPoolExecutor().submit(Model(), 1)
"""


def test_thread_spawns_reach_compiled_code_only_where_they_do():
    source = textwrap.dedent(THREADS)
    assert codes_at(source) == marked_lines(source, "DFD201")
    finding = scan_source(source)[0]
    assert finding.evidence["chain"] == [
        "level1 (<string>:16)", "level2 (<string>:13)", "level3 (<string>:10)", "step (<string>:5)",
    ]


def test_chain_depth_is_bounded():
    functions = "\n".join(f"def f{i}():\n    return f{i + 1}()\n" for i in range(12))
    source = f"import threading, torch\n{functions}\nf12 = torch.compile(lambda: 0)\n" \
             "threading.Thread(target=f0).start()\nthreading.Thread(target=f6).start()\n"
    lines = source.splitlines()
    found = codes_at(source)
    assert found == [(len(lines), "DFD201")]  # f6 -> f12 is in reach, f0 -> f12 is not


def test_closure_over_compiled_local_and_compiled_method_attribute():
    source = """\
        import threading
        import torch

        def main(model):
            model = torch.compile(model)

            def worker():
                model(1)

            threading.Thread(target=worker).start()  # DFD201

        class Runner:
            def __init__(self, model):
                self.model = model
                self.model.compile()

            def loop(self):
                self.model(1)

            def start(self):
                threading.Thread(target=self.loop).start()  # DFD201
    """
    source = textwrap.dedent(source)
    assert codes_at(source) == marked_lines(source, "DFD201")


def test_builtin_compile_and_re_compile_are_not_torch_compile():
    source = """\
        import re, threading
        code = compile("1", "<s>", "eval")
        pattern = re.compile("x")
        def worker():
            pattern.match("x")
            eval(code)
        threading.Thread(target=worker).start()
    """
    assert codes_at(source) == []


def test_flex_attention_compiled_by_rebinding_is_clean():
    source = """\
        import torch
        from torch.nn.attention.flex_attention import flex_attention
        flex_attention = torch.compile(flex_attention)
        def attend(q, k, v):
            return flex_attention(q, k, v)
    """
    assert codes_at(source) == []


def test_dynamo_config_look_alikes_are_clean():
    source = """\
        import torch._dynamo
        torch._dynamo.config.error_on_nested_fx_trace = True
        torch._dynamo.config.force_compile_during_fx_trace = False
        torch._dynamo.config.error_on_nested_fx_trace = flag
        class config:
            error_on_nested_fx_trace = False
        config.error_on_nested_fx_trace = False
        setattr(torch._dynamo.config, "verbose", False)
    """
    assert codes_at(source) == []


def test_unparsable_source_raises_value_error():
    with pytest.raises(ValueError, match="syntax error at line 1"):
        scan_source("def (:\n")


@pytest.mark.parametrize("installed,severity,phrase", [
    (None, "warning", "on transformers < 5.0 (every 4.x release)"),
    ("4.46.0", "warning", "checkpoints with the reentrant variant on transformers 4.46.0, installed here"),
    ("4.36.2", "warning", "checkpoints with the reentrant variant on transformers 4.36.2, installed here"),
    ("5.1.0", "info", "is non-reentrant on transformers 5.1.0, installed here, but reentrant wherever"),
])
def test_dfd104_names_the_transformers_releases_and_the_installed_one(tmp_path, installed, severity, phrase):
    from dflash_doctor.scan import scan_paths

    (tmp_path / "train.py").write_text("def prep(model):\n    model.gradient_checkpointing_enable()\n")
    report = scan_paths([str(tmp_path)], jobs=1, transformers=lambda: installed)
    [finding] = report.findings
    assert (finding.code, finding.severity.value) == ("DFD104", severity)
    assert phrase in finding.message
    assert "5.0 and later default to use_reentrant=False" in finding.message
    assert finding.evidence["transformers_installed"] == installed
    assert report.facts["transformers"] == installed


def test_installed_transformers_is_read_from_metadata_without_importing_it():
    import sys
    from importlib import metadata

    from dflash_doctor.scan.hf_releases import installed_transformers

    try:
        expected = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        expected = None
    assert installed_transformers() == expected
    assert "transformers" not in sys.modules


def test_global_rebinding_to_torch_compile_makes_the_decorator_compile():
    source = """\
        import threading
        import torch

        fuser = torch.jit.script

        def enable_fuser():
            global fuser
            fuser = torch.compile

        enable_fuser()

        @fuser
        def gelu(x):
            return x

        def worker():
            return gelu(1)

        threading.Thread(target=worker).start()  # DFD201
    """
    source = textwrap.dedent(source)
    assert codes_at(source) == marked_lines(source, "DFD201")


def test_elements_of_containers_and_loops_over_them():
    source = """\
        import threading
        import torch

        steps = {"train": torch.compile(lambda x: x), "eval": print}
        workers = [torch.compile(lambda: 0)]

        threading.Thread(target=steps["train"]).start()  # DFD201
        threading.Thread(target=steps["eval"]).start()
        for step in workers:
            threading.Thread(target=step).start()  # DFD201
    """
    source = textwrap.dedent(source)
    assert codes_at(source) == marked_lines(source, "DFD201")


def test_constructor_argument_from_a_module_beside_the_class(tmp_path):
    from dflash_doctor.scan import scan_paths

    (tmp_path / "workers.py").write_text(textwrap.dedent("""\
        import threading

        class Worker(threading.Thread):
            def __init__(self, name, step_fn):
                super().__init__(name=name)
                self.step_fn = step_fn

            def run(self):
                self.step_fn(1)
    """))
    (tmp_path / "main.py").write_text(textwrap.dedent("""\
        import torch
        from workers import Worker

        Worker("drafter-0", step_fn=torch.compile(lambda x: x)).start()
        Worker("logger", print).start()
    """))
    report = scan_paths([str(tmp_path)], jobs=1)
    [finding] = report.findings
    assert (finding.code, finding.line, finding.column) == ("DFD201", 8, 5)
    assert finding.evidence["compiled"]["path"].endswith("main.py")


def test_a_thread_file_without_a_thread_import_is_not_parsed(tmp_path):
    from dflash_doctor.scan import scan_paths

    (tmp_path / "notes.py").write_text("# Thread(target=x) in a comment, nothing imported\nx = 1\n")
    report = scan_paths([str(tmp_path)], jobs=1)
    assert report.facts["parsed"] == 0 and report.findings == []


def test_installed_transformers_is_the_dist_info_folder_on_the_path(tmp_path, monkeypatch):
    import sys

    from dflash_doctor.scan.hf_releases import installed_transformers

    (tmp_path / "transformers-4.57.1.dist-info").mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(tmp_path)])
    assert installed_transformers() == "4.57.1"
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing")])
    assert installed_transformers() is None
