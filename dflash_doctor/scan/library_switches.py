"""DFD104 (and DFD101/103 on what they are given) where a library switches Hugging Face gradient checkpointing on
for the user: the entry points of dflash_doctor/checkpoint_entry_points.py (PEFT's preparation helpers, TRL's
trainer configs and trainers), and a project's own TrainingArguments subclass whose `gradient_checkpointing` field
defaults to True. transformers' own switch is judged in checkpointing.py; both resolve values with values.py.
"""
from __future__ import annotations

import ast
from typing import List, Optional, Tuple, Union

from dflash_doctor.checkpoint_entry_points import (
    PEFT_INT8,
    PEFT_KBIT,
    TRL_CONFIGS,
    TRL_DEFAULT_ON,
    TRL_NON_REENTRANT,
    TRL_TRAINERS,
    EntryPoint,
)
from dflash_doctor.findings import Severity
from dflash_doctor.rules.scan import (
    CHECKPOINT_USE_REENTRANT_TRUE,
    CHECKPOINT_USE_REENTRANT_UNKNOWN,
    HF_GRADIENT_CHECKPOINTING_IMPLICIT,
)
from dflash_doctor.scan import hf_releases
from dflash_doctor.scan.callgraph import ModuleGraph
from dflash_doctor.scan.checkpointing import HF_KWARGS, HF_KWARGS_KEYS, TRAINING_ARGUMENTS, Verdict, combine, judge_mapping
from dflash_doctor.scan.context import FileContext, Located
from dflash_doctor.scan.file_check import FileCheck
from dflash_doctor.scan.resolve import LocalClass, describe
from dflash_doctor.scan.scopes import Scope
from dflash_doctor.scan.values import MAX_DEPTH, Values

SWITCH = "gradient_checkpointing"
# from_pretrained keywords that load a model quantized (bitsandbytes, GPTQ, AWQ... all go through the first)
QUANTIZING_KEYWORDS = frozenset({"quantization_config", "load_in_4bit", "load_in_8bit"})
# checkpoint names that are quantized already (unsloth's "-bnb-4bit", "-GPTQ", "-AWQ", Qwen's "-Int4")
PREQUANTIZED_MARKERS = ("bnb", "gptq", "awq", "int4", "int8", "4bit", "8bit", "gguf", "hqq", "eetq", "aqlm")
_FIX = 'pass gradient_checkpointing_kwargs={"use_reentrant": False}'


def _release(text: Optional[str]) -> Optional[Tuple[int, int, int]]:
    return hf_releases.parse(text) if text else None


def _spelled(release: Tuple[int, int, int]) -> str:
    return ".".join(map(str, release))


class LibrarySwitchRule(FileCheck):
    """Library calls and configs that switch checkpointing on: judged where they are called, built or declared."""

    def __init__(self, ctx: FileContext, graph: Optional[ModuleGraph]) -> None:
        super().__init__(ctx, graph)
        self._values = Values(ctx)
        # findings that a later `args.gradient_checkpointing_kwargs = ...` in the file would settle (Trainer reads
        # the attribute and re-enables checkpointing with it when it trains): (node, message, evidence, severity,
        # whether transformers' own default decides the variant), reported at the end
        self._pending: List[Tuple[Located, str, dict, Optional[Severity], bool]] = []
        self._assigns_hf_kwargs = False

    # -- values ------------------------------------------------------------------------------------------------

    def _verdict(self, node: ast.AST, scope: Scope, line: int) -> Verdict:
        verdicts: List[Verdict] = []
        for path in self._values.paths(node, scope, line):
            if isinstance(path, ast.Constant) and isinstance(path.value, bool):
                verdicts.append(("true" if path.value else "false", repr(path.value)))
            elif isinstance(path, ast.Constant) and path.value is None:
                verdicts.append(("missing", "None"))
            else:
                verdicts.append(("unknown", describe(node)))
        return combine(verdicts, node)

    def _kwargs_verdict(self, node: ast.AST, scope: Scope, line: int) -> Verdict:
        if isinstance(node, ast.Constant) and node.value is None:
            return "missing", ""
        return judge_mapping(node, expand=lambda n: self._values.paths(n, scope, line))

    # -- calls -------------------------------------------------------------------------------------------------

    def visit_call(self, node: ast.Call, scope: Scope) -> None:
        if not self.ctx.on_candidate_line(node):
            return
        line = node.lineno
        target = self.ctx.resolver.dotted(node.func, scope, line)
        for entry in (PEFT_KBIT, PEFT_INT8):
            if entry.resolves(target):
                self._helper(node, entry, scope)
                return
        if TRL_CONFIGS.resolves(target):
            if not any(k.arg in (SWITCH, None) for k in node.keywords):
                self._trl_default(node, f"{describe(node.func)}(...) without gradient_checkpointing")
            return
        if TRL_TRAINERS.resolves(target):
            if len(node.args) <= 1 and not any(k.arg in ("args", None) for k in node.keywords):
                self._trl_default(node, f"{describe(node.func)}(...) without args (it builds the default config)")
            return
        cls = self.ctx.resolver.class_ref(node.func, scope, line)
        if isinstance(cls, LocalClass) and self._training_arguments_class(cls.qualname) is not None:
            self._local_arguments(node, scope)

    def _helper(self, node: ast.Call, entry: EntryPoint, scope: Scope) -> None:
        """prepare_model_for_kbit_training(model, use_gradient_checkpointing=True, gradient_checkpointing_kwargs=None)"""
        line = node.lineno
        if any(k.arg is None for k in node.keywords) or any(isinstance(a, ast.Starred) for a in node.args):
            return  # **options / *args: decided by what they hold
        switch = _argument(node, entry.switch, entry.switch_position)
        switched = ("true", "True (the default)") if switch is None else self._verdict(switch, scope, line)
        if switched[0] in ("false", "missing"):  # False, or None: the helper leaves checkpointing off
            return
        kwargs = _argument(node, entry.kwargs, entry.kwargs_position)
        verdict = ("missing", "") if kwargs is None else self._kwargs_verdict(kwargs, scope, line)
        name = f"{describe(node.func)}(...)"
        evidence = {"call": name, "library": entry.library, entry.switch: switched[1], "use_reentrant": None}
        if verdict[0] == "false":
            return
        if verdict[0] in ("true", "unknown"):
            if kwargs is not None and _keyword(node, entry.kwargs) is None:  # positional: checkpointing.py skips it
                rule = CHECKPOINT_USE_REENTRANT_TRUE if verdict[0] == "true" else CHECKPOINT_USE_REENTRANT_UNKNOWN
                self.ctx.report(rule, node, f"{name} passes use_reentrant={verdict[1]} to Hugging Face gradient "
                                "checkpointing", {**evidence, "use_reentrant": verdict[1]})
            return
        given = "gradient_checkpointing_kwargs without use_reentrant" if kwargs is not None and not (
            isinstance(kwargs, ast.Constant) and kwargs.value is None) else "no gradient_checkpointing_kwargs"
        how = f"{entry.switch}={switched[1]}" if switch is not None else f"{entry.switch} defaults to True"
        first = entry.releases[0].first
        since = f" (from {_spelled(first)})" if first else ""
        message = (f"{name} turns Hugging Face gradient checkpointing on {entry.condition} ({how}) with {given}: "
                   f"every {entry.library} release with it{since} runs the reentrant checkpoint "
                   f"({entry.releases[-1].how}); {_FIX}")
        if switched[0] == "unknown":
            # the helper has no non-reentrant path: whenever the flag turns checkpointing on, it is reentrant
            message = f"{message} (checkpointing is on whenever {switched[1]} is true)"
        severity = None
        loaded = self._loaded_unquantized(node, scope) if entry.quantized_only else None
        if loaded is not None:
            severity = Severity.INFO
            message = (f"{message}; but the model comes from {loaded} with no quantization config, and "
                       f"{entry.library} switches it on only for a quantized model (a pre-quantized checkpoint is one)")
        self._pending.append((node, message, evidence, severity, False))

    def _loaded_unquantized(self, node: ast.Call, scope: Scope) -> Optional[str]:
        """`model = X.from_pretrained(...)` just before, with none of the keywords that quantize it (and no
        **mapping that may hold one): the call as spelled, else None."""
        model = node.args[0] if node.args else _keyword(node, "model")
        if not isinstance(model, ast.Name):
            return None
        binding = self.ctx.table.lookup(model.id, scope, node.lineno - 1)
        loaded = binding.node if binding is not None and binding.kind == "assign" else None
        if not (isinstance(loaded, ast.Call) and isinstance(loaded.func, ast.Attribute)
                and loaded.func.attr == "from_pretrained"):
            return None
        if any(k.arg is None or k.arg in QUANTIZING_KEYWORDS for k in loaded.keywords):
            return None
        named = next((a.value for a in loaded.args[:1] if isinstance(a, ast.Constant) and isinstance(a.value, str)), "")
        if any(marker in named.lower() for marker in PREQUANTIZED_MARKERS):
            return None
        return f"{describe(loaded.func)}(...) on line {loaded.lineno}"

    def _trl_default(self, node: ast.Call, spelled: str) -> None:
        """A TRL config (or a trainer that builds one) that never names gradient_checkpointing: on by default from
        TRL 0.22.0, non-reentrant by default from 0.27.0."""
        installed = hf_releases.installed_release("trl")
        release = _release(installed)
        if release is not None and not TRL_DEFAULT_ON <= release < TRL_NON_REENTRANT:
            return  # off by default (older) or non-reentrant by default (newer) on the release installed here
        if any(k.arg in HF_KWARGS_KEYS for k in node.keywords):
            return  # judged by checkpointing.py as given
        on, non_reentrant = _spelled(TRL_DEFAULT_ON), _spelled(TRL_NON_REENTRANT)
        where = f"on trl {installed}, installed here" if installed else "with trl not installed here"
        message = (f"{spelled}: trl {on} to before {non_reentrant} switch gradient checkpointing on by default and "
                   f"hand it to transformers without use_reentrant, reentrant on transformers 4.x ({where}; off by "
                   f"default before {on}, use_reentrant=False by default from {non_reentrant}); {_FIX}")
        evidence = {"call": spelled, "library": "trl", "trl_installed": installed, "use_reentrant": None}
        self._pending.append((node, message, evidence, None if release is not None else Severity.INFO, True))

    def _local_arguments(self, node: ast.Call, scope: Scope) -> None:
        """`MyArguments(gradient_checkpointing=...)` of a project's TrainingArguments subclass (a field default is
        judged where it is declared)."""
        switch = next((k.value for k in node.keywords if k.arg == SWITCH), None)
        if switch is None or any(k.arg in HF_KWARGS_KEYS or k.arg is None for k in node.keywords):
            return
        verdict = self._verdict(switch, scope, node.lineno)
        if verdict[0] == "true":
            spelled = f"{describe(node.func)}(gradient_checkpointing={verdict[1]})"
            self._pending.append((node, self._trainer_message(spelled), {"call": spelled, "use_reentrant": None},
                                  None, True))

    def _trainer_message(self, spelled: str) -> str:
        version = self.ctx.transformers_version
        return (f"{spelled} with no gradient_checkpointing_kwargs (Trainer enables it with None) "
                f"{hf_releases.implicit_default(version)}; {_FIX}")

    # -- a TrainingArguments subclass's own defaults -------------------------------------------------------------

    def _training_arguments_class(self, qualname: str, depth: int = 0) -> Optional[str]:
        """The Hugging Face or TRL arguments class a local class derives from (None: not one)."""
        cls = self.ctx.table.by_qualname.get(qualname)
        if cls is None or not isinstance(cls.node, ast.ClassDef) or cls.parent is None or depth > MAX_DEPTH:
            return None
        for base in cls.node.bases:
            dotted = self.ctx.resolver.dotted(base, cls.parent, cls.node.lineno)
            if dotted in TRAINING_ARGUMENTS or TRL_CONFIGS.resolves(dotted):
                return dotted
            ref = self.ctx.resolver.class_ref(base, cls.parent, cls.node.lineno)
            if isinstance(ref, LocalClass):
                found = self._training_arguments_class(ref.qualname, depth + 1)
                if found is not None:
                    return found
        return None

    def visit_assign(self, node: Union[ast.Assign, ast.AnnAssign], scope: Scope) -> None:
        if not self.ctx.on_candidate_line(node) or node.value is None:
            return
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in HF_KWARGS_KEYS or isinstance(
                    target, ast.Subscript) and isinstance(target.slice, ast.Constant) and target.slice.value in \
                    HF_KWARGS_KEYS:
                self._assigns_hf_kwargs = True
        if scope.kind != "class" or not any(isinstance(t, ast.Name) and t.id == SWITCH for t in targets):
            return
        parent = self._training_arguments_class(scope.qualname)
        if parent is None:
            return
        value = self._values.field_default(node.value, scope, node.lineno)
        verdict = self._verdict(value, scope, node.lineno) if value is not None else ("unknown", "")
        if verdict[0] != "true":
            return
        fields = self._values.class_fields(scope, HF_KWARGS)
        kwargs = [self._values.field_default(b.node, b.scope, b.line) for b in fields]
        kwargs_verdict = combine([self._kwargs_verdict(k, scope, node.lineno) if k is not None else
                                  ("unknown", "") for k in kwargs], node) if kwargs else ("missing", "")
        spelled = f"{scope.qualname}.gradient_checkpointing (a {parent.rsplit('.', 1)[-1]} field defaulting to True)"
        evidence = {"call": spelled, "use_reentrant": kwargs_verdict[1] or None}
        if kwargs_verdict[0] == "missing":
            self._pending.append((node, self._trainer_message(spelled), evidence, None, True))
        elif kwargs_verdict[0] == "true":
            self.ctx.report(CHECKPOINT_USE_REENTRANT_TRUE, node, f"{spelled} with gradient_checkpointing_kwargs "
                            f"use_reentrant={kwargs_verdict[1]}; use False", evidence)
        elif kwargs_verdict[0] == "unknown":
            self.ctx.report(CHECKPOINT_USE_REENTRANT_UNKNOWN, node, f"{spelled}: use_reentrant in its "
                            f"gradient_checkpointing_kwargs is {kwargs_verdict[1]}, decided at run time", evidence)

    def finish(self) -> None:
        if self._assigns_hf_kwargs:
            return  # the file sets the kwargs on the arguments before training: judged there
        reentrant = hf_releases.default_is_reentrant(self.ctx.transformers_version)
        for node, message, evidence, severity, transformers_decides in self._pending:
            if transformers_decides and reentrant is False and severity is None:
                severity = Severity.INFO
            evidence = {**evidence, "transformers_installed": self.ctx.transformers_version}
            self.ctx.report(HF_GRADIENT_CHECKPOINTING_IMPLICIT, node, message, evidence, severity=severity)


def _keyword(node: ast.Call, name: str) -> Optional[ast.expr]:
    return next((k.value for k in node.keywords if k.arg == name), None)


def _argument(node: ast.Call, name: str, position: Optional[int]) -> Optional[ast.expr]:
    found = _keyword(node, name)
    if found is None and position is not None and len(node.args) > position:
        return node.args[position]
    return found
