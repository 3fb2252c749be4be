"""Library entry points that switch gradient checkpointing on for the user, and on which releases that runs the
reentrant variant when the user does not say (DFD104), declared once.

transformers' own switch (`gradient_checkpointing_enable`, `TrainingArguments(gradient_checkpointing=True)`) is in
scan/hf_releases.py. This table holds the libraries on top of it. Each entry was read in the library's own sources
(git tags of its repository, and the released wheel where named), 2026-12-06:

- PEFT `prepare_model_for_kbit_training(model)` (0.4.0 to 0.21.2, the newest release): `use_gradient_checkpointing`
  defaults to True and, on a quantized model (8/4-bit, GPTQ, AQLM, EETQ, HQQ, torchao: the QLoRA path), it calls
  `model.gradient_checkpointing_enable(...)`. From 0.6.0 `gradient_checkpointing_kwargs=None` becomes `{}` and is
  passed on as it is, so torch's own default runs: reentrant on every transformers release (transformers 5.0 turns
  only None into use_reentrant=False, read in the 5.0.0 wheel). 0.4.0-0.5.0 call it with no kwargs: transformers'
  default, reentrant before 5.0.
- PEFT `prepare_model_for_int8_training(model)` (0.2.0 to 0.9.0, removed in 0.10.0): the same switch (0.2-0.3 call
  `gradient_checkpointing_enable()` themselves; 0.5-0.9 forward to prepare_model_for_kbit_training).
- TRL's trainer configs (`SFTConfig`, `DPOConfig`, `GRPOConfig`, ..., TrainingArguments subclasses): 0.22.0 made
  `gradient_checkpointing` default to True (PR #3510), so a config that never names it checkpoints; 0.27.0 made
  them default to use_reentrant=False (PR #4811: `__post_init__` sets it on transformers < 5; from 0.28.0 the
  trainer's `__init__` does). So: before 0.22 off unless asked, 0.22.0-0.26.2 reentrant on transformers 4.x, from
  0.27.0 non-reentrant. A trainer built without `args` (`SFTTrainer(model=...)`) makes the default config.
- Axolotl YAML configs (`gradient_checkpointing: true`), 0.4.0 to 0.18.0: without `gradient_checkpointing_kwargs`,
  `rl` or `unfrozen_parameters`, axolotl's config normalisation sets `{"use_reentrant": True}` (Gemma 4 models
  excepted since 2026-04). `scan` reads Python sources only, so a YAML config is not judged.
- Not reentrant, so never reported: Accelerate's FSDP `activation_checkpointing` (FullyShardedDataParallelPlugin,
  since it was added in 2023-08: `checkpoint_wrapper` with CheckpointImpl.NO_REENTRANT, and FSDP2's
  `fsdp2_apply_ac` with the wrapper's default, NO_REENTRANT), Lightning's FSDPStrategy(activation_checkpointing_
  policy=...) (torch's checkpoint_wrapper, NO_REENTRANT by default and passed explicitly before torch 2.2).

Importing this module never imports torch or any of these libraries; installed releases are read from package
metadata folders (scan/hf_releases.py).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import FrozenSet, Optional, Tuple

Release = Tuple[int, int, int]


class Variant(str, enum.Enum):
    """Which checkpoint runs when the user names neither the switch's kwargs nor use_reentrant."""

    REENTRANT = "reentrant"  # on every transformers release
    REENTRANT_BEFORE_TRANSFORMERS_5 = "reentrant on transformers < 5"  # transformers' own default decides
    NON_REENTRANT = "non-reentrant"
    OFF = "off"  # checkpointing is not switched on unless asked


class Scanned(str, enum.Enum):
    """How `scan` meets the entry point in user code."""

    CALL = "call"  # a call of the helper: judged where it is called
    CONFIG = "config"  # a TrainingArguments subclass: judged where it is built (or a trainer builds it)
    NOT_PYTHON = "not read"  # a YAML config: scan reads Python only
    NEVER_REENTRANT = "never reported"  # declared so nobody adds a rule for it


@dataclass(frozen=True)
class ReleaseRange:
    first: Optional[Release]  # None: from the first release
    before: Optional[Release]  # None: up to the newest release read
    variant: Variant
    how: str  # what the library does on these releases, in one clause

    def holds(self, release: Release) -> bool:
        return (self.first is None or release >= self.first) and (self.before is None or release < self.before)

    @property
    def spelled(self) -> str:
        first = ".".join(map(str, self.first)) if self.first else ""
        before = ".".join(map(str, self.before)) if self.before else ""
        if first and before:
            return f"{first} to before {before}"
        return f"{first} and later" if first else f"before {before}"


@dataclass(frozen=True)
class EntryPoint:
    library: str  # the distribution name, as its metadata folder spells it
    names: FrozenSet[str]  # the last part of the dotted names it is reached by
    modules: FrozenSet[str]  # the modules those names may be imported from (prefixes)
    scanned: Scanned
    releases: Tuple[ReleaseRange, ...]
    # CALL: the keyword that switches checkpointing off and its position; the kwargs keyword and its position
    switch: str = ""
    switch_position: Optional[int] = None
    kwargs: str = "gradient_checkpointing_kwargs"
    kwargs_position: Optional[int] = None
    condition: str = ""  # when the library switches it on at all
    quantized_only: bool = False  # only for a quantized model: one loaded here without quantization is info
    newest_read: str = ""  # the newest release whose sources were read
    summary: str = ""  # what DFD104 says of it, in one clause (its rationale, so explain, --help and docs/rules.md)

    def variant(self, release: Optional[Release]) -> Optional[Variant]:
        """What runs on `release` (None: not known here)."""
        if release is None:
            return None
        return next((r.variant for r in self.releases if r.holds(release)), None)

    def reentrant_ranges(self) -> str:
        return ", ".join(f"{self.library} {r.spelled} ({r.how})" for r in self.releases
                         if r.variant in (Variant.REENTRANT, Variant.REENTRANT_BEFORE_TRANSFORMERS_5))

    def resolves(self, dotted: Optional[str]) -> bool:
        if not dotted:
            return False
        module, _, name = dotted.rpartition(".")
        return name in self.names and any(module == m or module.startswith(m + ".") for m in self.modules)


PEFT_KBIT = EntryPoint(
    library="peft",
    names=frozenset({"prepare_model_for_kbit_training"}),
    modules=frozenset({"peft"}),
    scanned=Scanned.CALL,
    switch="use_gradient_checkpointing", switch_position=1, kwargs_position=2,
    condition="for a quantized model (the QLoRA path)",
    quantized_only=True,
    newest_read="0.21.2",
    releases=(
        ReleaseRange((0, 4, 0), (0, 6, 0), Variant.REENTRANT_BEFORE_TRANSFORMERS_5,
                     "gradient_checkpointing_enable() with no kwargs"),
        ReleaseRange((0, 6, 0), None, Variant.REENTRANT,
                     "gradient_checkpointing_kwargs None becomes {}, so torch's reentrant default runs"),
    ),
    summary="PEFT's prepare_model_for_kbit_training(model) on a quantized model (the QLoRA path): "
            "use_gradient_checkpointing defaults to True and every release that has it (0.4.0 to 0.21.2) passes {} "
            "or nothing, so torch's (or transformers 4.x's) reentrant default runs",
)
PEFT_INT8 = EntryPoint(
    library="peft",
    names=frozenset({"prepare_model_for_int8_training"}),
    modules=frozenset({"peft"}),
    scanned=Scanned.CALL,
    switch="use_gradient_checkpointing", switch_position=1, kwargs_position=2,
    condition="for an 8-bit model",
    quantized_only=True,
    newest_read="0.9.0 (removed in 0.10.0)",
    releases=(
        ReleaseRange((0, 2, 0), (0, 6, 0), Variant.REENTRANT_BEFORE_TRANSFORMERS_5,
                     "gradient_checkpointing_enable() with no kwargs"),
        ReleaseRange((0, 6, 0), (0, 10, 0), Variant.REENTRANT,
                     "forwards to prepare_model_for_kbit_training, which passes {}"),
    ),
    summary="PEFT's prepare_model_for_int8_training(model) (0.2.0 to 0.9.0), the same",
)
# TRL's trainer configs whose gradient_checkpointing default became True in 0.22.0 (read in the v0.22.0 tag; from
# 0.26 the last six live in trl.experimental with their own defaults).
TRL_CONFIG_NAMES = frozenset({
    "SFTConfig", "DPOConfig", "GRPOConfig", "RewardConfig", "RLOOConfig", "KTOConfig", "ORPOConfig", "CPOConfig",
    "BCOConfig", "PRMConfig", "OnlineDPOConfig", "IterativeSFTConfig",
})
_TRL_RELEASES = (
    ReleaseRange(None, (0, 22, 0), Variant.REENTRANT_BEFORE_TRANSFORMERS_5,
                 "gradient_checkpointing defaults to False; when set, Trainer passes no kwargs"),
    ReleaseRange((0, 22, 0), (0, 27, 0), Variant.REENTRANT_BEFORE_TRANSFORMERS_5,
                 "gradient_checkpointing defaults to True and Trainer passes no kwargs"),
    ReleaseRange((0, 27, 0), None, Variant.NON_REENTRANT, "use_reentrant defaults to False"),
)
TRL_CONFIGS = EntryPoint(
    library="trl",
    names=TRL_CONFIG_NAMES,
    modules=frozenset({"trl"}),
    scanned=Scanned.CONFIG,
    switch="gradient_checkpointing",
    condition="when the trainer trains",
    newest_read="1.9.0",
    releases=_TRL_RELEASES,
    summary="TRL's trainer configs (SFTConfig, DPOConfig, GRPOConfig, ...) that never name gradient_checkpointing, "
            "on by default on TRL 0.22.0 to 0.26.x (a warning where that TRL is installed, info where none is); from "
            "0.27.0 TRL defaults to use_reentrant=False, so gradient_checkpointing=True on its configs is info there",
)
# The trainers that build their config when `args` is left out (SFTTrainer(model=...)): the same defaults.
TRL_TRAINERS = EntryPoint(
    library="trl",
    names=frozenset(name.replace("Config", "Trainer") for name in TRL_CONFIG_NAMES),
    modules=frozenset({"trl"}),
    scanned=Scanned.CONFIG,
    switch="gradient_checkpointing",
    condition="with no args: the trainer makes the default config",
    newest_read="1.9.0",
    releases=_TRL_RELEASES,
    summary="TRL's trainers built without args (SFTTrainer(model=...)), which make that default config",
)
# The first TRL release whose configs switch checkpointing on by default, and the first that default it to
# use_reentrant=False.
TRL_DEFAULT_ON: Release = (0, 22, 0)
TRL_NON_REENTRANT: Release = (0, 27, 0)

AXOLOTL_YAML = EntryPoint(
    library="axolotl",
    names=frozenset({"gradient_checkpointing"}),
    modules=frozenset(),
    scanned=Scanned.NOT_PYTHON,
    condition="a YAML config with gradient_checkpointing: true and no gradient_checkpointing_kwargs, rl or "
              "unfrozen_parameters",
    newest_read="0.18.0",
    releases=(ReleaseRange((0, 4, 0), None, Variant.REENTRANT, 'config normalisation sets {"use_reentrant": True}'),),
    summary="not read: Axolotl YAML configs (gradient_checkpointing: true gets use_reentrant=True on 0.4.0 to "
            "0.18.0), since scan reads Python sources",
)
ACCELERATE_FSDP = EntryPoint(
    library="accelerate",
    names=frozenset({"FullyShardedDataParallelPlugin"}),
    modules=frozenset({"accelerate"}),
    scanned=Scanned.NEVER_REENTRANT,
    condition="activation_checkpointing=True",
    newest_read="main of 2026-07-24",
    releases=(ReleaseRange(None, None, Variant.NON_REENTRANT, "checkpoint_wrapper with CheckpointImpl.NO_REENTRANT"),),
    summary="never reported: Accelerate's FSDP activation_checkpointing (CheckpointImpl.NO_REENTRANT)",
)
LIGHTNING_FSDP = EntryPoint(
    library="lightning",
    names=frozenset({"FSDPStrategy"}),
    modules=frozenset({"lightning", "pytorch_lightning", "lightning_fabric"}),
    scanned=Scanned.NEVER_REENTRANT,
    condition="activation_checkpointing_policy=...",
    newest_read="master of 2026-07-20",
    releases=(ReleaseRange(None, None, Variant.NON_REENTRANT, "torch's checkpoint_wrapper, NO_REENTRANT"),),
    summary="Lightning's FSDPStrategy activation checkpointing (torch's checkpoint_wrapper, NO_REENTRANT)",
)

ENTRY_POINTS: Tuple[EntryPoint, ...] = (
    PEFT_KBIT, PEFT_INT8, TRL_CONFIGS, TRL_TRAINERS, AXOLOTL_YAML, ACCELERATE_FSDP, LIGHTNING_FSDP)
CALLS: Tuple[EntryPoint, ...] = tuple(e for e in ENTRY_POINTS if e.scanned is Scanned.CALL)
# The words whose lines hold the calls scan judges (rules/scan.py: DFD104's candidate-line words).
CALL_WORDS: Tuple[str, ...] = tuple(sorted(name for e in ENTRY_POINTS if e.scanned in (Scanned.CALL, Scanned.CONFIG)
                                           for name in e.names))


def coverage_sentence() -> str:
    """What DFD104 says it covers beyond transformers (its rationale, so explain, --help and docs/rules.md)."""
    return "; ".join(entry.summary for entry in ENTRY_POINTS if entry.summary)
