"""DFD104 where a library switches gradient checkpointing on (PEFT, TRL), and the values scan follows to decide
whether `gradient_checkpointing` / `use_reentrant` is True (scan/values.py)."""
from __future__ import annotations

import sys
import textwrap

import pytest

from dflash_doctor.checkpoint_entry_points import (
    CALL_WORDS,
    ENTRY_POINTS,
    TRL_DEFAULT_ON,
    TRL_NON_REENTRANT,
    Scanned,
    Variant,
)
from dflash_doctor.rules.catalog import lookup
from dflash_doctor.scan import scan_paths
from dflash_doctor.scan.engine import scan_source


def findings(source: str):
    return [(f.line, f.code, f.severity.value) for f in scan_source(textwrap.dedent(source), "train.py")]


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """Put `NAME-VERSION.dist-info` folders on sys.path (and nothing else), as an installed release looks."""

    def install(**releases):
        site = tmp_path / ("site-" + "-".join(f"{name}{version}" for name, version in sorted(releases.items())))
        site.mkdir()
        for name, version in releases.items():
            (site / f"{name}-{version}.dist-info").mkdir()
        monkeypatch.setattr(sys, "path", [str(site)])
    return install


QLORA = """\
    from peft import prepare_model_for_kbit_training

    def load(model, resume_from_checkpoint=None):
        model = prepare_model_for_kbit_training(model)
        return model
"""


def test_peft_preparation_is_reentrant_whatever_transformers_says(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent(QLORA))
    for transformers in (None, "4.46.0", "5.1.0"):
        report = scan_paths([str(tmp_path)], jobs=1, transformers=lambda: transformers)
        [finding] = report.findings
        # PEFT turns None into {} and passes it: torch's reentrant default, which transformers 5 leaves alone
        assert (finding.line, finding.code, finding.severity.value) == (4, "DFD104", "warning")
        assert "every peft release with it (from 0.4.0) runs the reentrant checkpoint" in finding.message
        assert finding.evidence["library"] == "peft"


def test_library_entry_points_are_read_only_in_files_that_say_checkpoint(tmp_path):
    # the byte prefilter's trade (rules/scan.py PEFT_ENTRY, TRL_ENTRY): one substring search per file for DFD1xx
    (tmp_path / "train.py").write_text(textwrap.dedent(QLORA).replace("resume_from_checkpoint", "resume"))
    assert scan_paths([str(tmp_path)], jobs=1, transformers=lambda: None).findings == []


@pytest.mark.parametrize("call,expected", [
    ("prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)", []),
    ("prepare_model_for_kbit_training(model, False)", []),
    ("prepare_model_for_kbit_training(model, use_gradient_checkpointing=None)", []),
    ('prepare_model_for_kbit_training(model, gradient_checkpointing_kwargs={"use_reentrant": False})', []),
    ('prepare_model_for_kbit_training(model, True, {"use_reentrant": False})', []),
    ('prepare_model_for_kbit_training(model, True, {"use_reentrant": True})', [(4, "DFD101", "warning")]),
    ('prepare_model_for_kbit_training(model, gradient_checkpointing_kwargs={"use_reentrant": True})',
     [(4, "DFD101", "warning")]),
    ('prepare_model_for_kbit_training(model, gradient_checkpointing_kwargs={"preserve_rng_state": True})',
     [(4, "DFD104", "warning")]),
    # the user's own flag: whenever it turns checkpointing on, the helper's only variant is the reentrant one
    ("prepare_model_for_kbit_training(model, use_gradient_checkpointing=flag)", [(4, "DFD104", "warning")]),
    ("prepare_model_for_kbit_training(model, **options)", []),
    ("prepare_model_for_int8_training(model)", [(4, "DFD104", "warning")]),
])
def test_peft_preparation_is_judged_on_its_switch_and_kwargs(call, expected):
    source = f"""\
    from peft import prepare_model_for_kbit_training, prepare_model_for_int8_training

    def load(model, flag, options):
        return {call}
    """
    assert findings(source) == expected


def test_peft_preparation_is_settled_when_the_trainer_re_enables_it_non_reentrant():
    source = """\
    from peft import prepare_model_for_kbit_training

    def main(model, training_args):
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=training_args.gradient_checkpointing)
        training_args.gradient_checkpointing_kwargs = {"use_reentrant": False}
        return model
    """
    assert findings(source) == []


@pytest.mark.parametrize("load,severity", [
    ('AutoModelForCausalLM.from_pretrained(name, torch_dtype="bfloat16")', "info"),  # PEFT switches nothing on
    ("AutoModelForCausalLM.from_pretrained(name, quantization_config=quant)", "warning"),
    ("AutoModelForCausalLM.from_pretrained(name, load_in_8bit=True)", "warning"),
    ("AutoModelForCausalLM.from_pretrained(name, **options)", "warning"),
    ('AutoModelForCausalLM.from_pretrained("org/llama-3-8b-bnb-4bit")', "warning"),  # quantized already
    ("load_model(name)", "warning"),
])
def test_peft_preparation_of_a_model_loaded_without_quantization_is_info(load, severity):
    source = f"""\
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM

    def load(name, quant, options, load_model):
        model = {load}
        model = prepare_model_for_kbit_training(model)
        return model
    """
    assert findings(source) == [(6, "DFD104", severity)]


def test_a_local_function_of_the_same_name_is_not_peft():
    assert findings("""\
    def prepare_model_for_kbit_training(model):
        return model

    def load(model):
        return prepare_model_for_kbit_training(model)
    """) == []


TRL_DEFAULTS = """\
    from trl import SFTConfig, SFTTrainer

    def build(model, data):
        config = SFTConfig(output_dir="out")
        trainer = SFTTrainer(model=model, train_dataset=data)
        explicit = SFTConfig(output_dir="out", gradient_checkpointing=False)
        given = SFTTrainer(model, config, train_dataset=data)
        return config, trainer, explicit, given
"""


@pytest.mark.parametrize("trl,expected", [
    (None, [(4, "DFD104", "info"), (5, "DFD104", "info")]),  # not installed: reentrant only on 0.22-0.26
    ("0.21.0", []),  # off by default
    ("0.24.0", [(4, "DFD104", "warning"), (5, "DFD104", "warning")]),  # on by default, no use_reentrant
    ("0.27.0", []),  # use_reentrant=False by default
    ("1.9.0", []),
])
def test_trl_default_on_configs_follow_the_installed_release(installed, trl, expected):
    installed(**({"trl": trl} if trl else {}))
    assert findings(TRL_DEFAULTS) == expected


def test_trl_explicit_switch_is_info_where_trl_defaults_to_non_reentrant(installed):
    source = """\
    from trl import DPOConfig

    def build():
        return DPOConfig(output_dir="out", gradient_checkpointing=True)
    """
    installed(trl="0.26.2")
    assert findings(source) == [(4, "DFD104", "warning")]
    installed(trl="0.28.0")
    [finding] = scan_source(textwrap.dedent(source), "train.py")
    assert (finding.code, finding.severity.value) == ("DFD104", "info")
    assert "defaults it to use_reentrant=False" in finding.message


@pytest.mark.parametrize("body,expected", [
    # a parameter's default, and whatever a caller passes
    ("def f(model, gc=True):\n    return TrainingArguments('o', gradient_checkpointing=gc)\n", [(2, "DFD104")]),
    ("def f(model, gc=False):\n    return TrainingArguments('o', gradient_checkpointing=gc)\n", []),
    ("def f(model, *, gc=True):\n    return TrainingArguments('o', gradient_checkpointing=gc)\n", [(2, "DFD104")]),
    # a default the function replaces first (`if x is None: x = GLOBAL`) is not the value
    ("def f(model, gc=None):\n    if gc is None:\n        gc = DEFAULT\n"
     "    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': gc})\n", [(4, "DFD103")]),
    # a constant looked up in a dict literal
    ("CFG = {'gc': True}\ndef f():\n    return TrainingArguments('o', gradient_checkpointing=CFG['gc'])\n",
     [(3, "DFD104")]),
    ("CFG = {'gc': False}\ndef f():\n    return TrainingArguments('o', gradient_checkpointing=CFG['gc'])\n", []),
    # getattr with a default, and `or`
    ("def f(cfg):\n    return TrainingArguments('o', gradient_checkpointing=getattr(cfg, 'gc', True))\n",
     [(2, "DFD104")]),
    ("def f(model, kw=None):\n    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw or "
     "{'use_reentrant': True})\n", [(2, "DFD101")]),
    ("def f(model, kw=None):\n    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw or "
     "{'use_reentrant': False})\n", [(2, "DFD103")]),
    # the enable method as a bound method in a local name
    ("def f(model):\n    switch = model.gradient_checkpointing_enable\n    switch()\n", [(3, "DFD104")]),
    ("def f(model):\n    switch = getattr(model, 'gradient_checkpointing_disable')\n    switch()\n", []),
])
def test_values_reach_the_switch(body, expected):
    source = "from transformers import TrainingArguments\n" + body
    assert [(line, code) for line, code, _ in findings(source)] == [(line + 1, code) for line, code in expected]


def test_a_field_given_where_the_config_is_built_wins_over_its_default():
    assert findings("""\
    from dataclasses import dataclass
    from transformers import TrainingArguments

    @dataclass
    class Run:
        gradient_checkpointing: bool = True

    def off():
        run = Run(gradient_checkpointing=False)
        return TrainingArguments("o", gradient_checkpointing=run.gradient_checkpointing)

    def on():
        run = Run()
        return TrainingArguments("o", gradient_checkpointing=run.gradient_checkpointing)
    """) == [(14, "DFD104", "warning")]


def test_a_subclass_field_is_reported_once_at_the_field_and_settled_by_a_later_kwargs_assignment():
    source = """\
    from dataclasses import dataclass, field
    import transformers

    @dataclass
    class Args(transformers.TrainingArguments):
        gradient_checkpointing: bool = field(default=True)

    def build():
        return Args(output_dir="o")
    """
    assert findings(source) == [(6, "DFD104", "warning")]
    settled = source + '    args.gradient_checkpointing_kwargs = {"use_reentrant": False}\n'
    assert findings(settled) == []


def test_subclass_of_a_subclass_and_explicit_construction():
    assert findings("""\
    from transformers import TrainingArguments

    class Base(TrainingArguments):
        pass

    class Mine(Base):
        pass

    def build(flag=True):
        return Mine(output_dir="o", gradient_checkpointing=flag)
    """) == [(10, "DFD104", "warning")]


def test_the_table_is_what_dfd104_says_and_scans():
    rationale = lookup("DFD104").rationale
    for entry in ENTRY_POINTS:
        assert entry.summary and entry.summary in rationale
        for first, second in zip(entry.releases, entry.releases[1:]):
            assert first.before == second.first, f"{entry.library}: release ranges must meet"
        if entry.scanned in (Scanned.CALL, Scanned.CONFIG):
            assert entry.names <= set(CALL_WORDS)
        if entry.scanned is Scanned.NEVER_REENTRANT:
            assert {r.variant for r in entry.releases} == {Variant.NON_REENTRANT}
    assert TRL_DEFAULT_ON < TRL_NON_REENTRANT
