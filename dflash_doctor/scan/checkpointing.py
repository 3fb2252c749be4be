"""DFD101-DFD104: gradient checkpointing whose use_reentrant is True, missing or unknown.

Calls are recognised by what they resolve to (`torch.utils.checkpoint.checkpoint` under any alias, through
`functools.partial`, or a name/attribute bound to either), never by the word `checkpoint`: weight
checkpointing (`save_checkpoint`, `self.checkpoint(...)`, a local `def checkpoint`) resolves to nothing.
"""
from __future__ import annotations

import ast
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from dflash_doctor.rules.scan import (
    CHECKPOINT_USE_REENTRANT_IMPLICIT,
    CHECKPOINT_USE_REENTRANT_TRUE,
    CHECKPOINT_USE_REENTRANT_UNKNOWN,
    HF_GRADIENT_CHECKPOINTING_IMPLICIT,
)
from dflash_doctor.checkpoint_entry_points import TRL_NON_REENTRANT
from dflash_doctor.findings import Severity
from dflash_doctor.scan import hf_releases
from dflash_doctor.scan.callgraph import ModuleGraph
from dflash_doctor.scan.context import FileContext, Located
from dflash_doctor.scan.file_check import FileCheck
from dflash_doctor.scan.resolve import LocalClass, describe
from dflash_doctor.scan.scopes import Binding, Scope
from dflash_doctor.scan.values import Values, getattr_attribute

CHECKPOINT_FUNCTIONS = frozenset({
    "torch.utils.checkpoint.checkpoint",
    "torch.utils.checkpoint.checkpoint_sequential",
})
# torch.distributed's module wrapper (what FSDP trainers use, often through apply_activation_checkpointing's
# checkpoint_wrapper_fn): its checkpoint_impl (keyword or second argument) picks the variant, NO_REENTRANT by
# default on every release with torch.compile.
CHECKPOINT_WRAPPER = "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper"
IMPL_KEYWORD = "checkpoint_impl"
# torch's reentrant implementation itself, called directly (nanotron-style `CheckpointFunction.apply(fn, ...)`).
REENTRANT_FUNCTION = "torch.utils.checkpoint.CheckpointFunction.apply"
# checkpoint_sequential(functions, segments, input, use_reentrant=None, **kwargs) also takes it positionally.
_POSITIONAL_INDEX = {"torch.utils.checkpoint.checkpoint_sequential": 3}
HF_ENABLE = "gradient_checkpointing_enable"
# transformers >= 5 (late): the same switch under its new name, non-reentrant by default (scan/hf_releases.py)
HF_ENABLE_NON_REENTRANT = "activation_checkpointing_enable"
HF_KWARGS = "gradient_checkpointing_kwargs"
HF_KWARGS_KEYS = frozenset({HF_KWARGS, "activation_checkpointing_kwargs"})
# TrainingArguments(gradient_checkpointing=True) makes Trainer call gradient_checkpointing_enable with
# args.gradient_checkpointing_kwargs (None unless given); TRL's *Config classes inherit that field.
TRAINING_ARGUMENTS = frozenset({
    "transformers.TrainingArguments", "transformers.Seq2SeqTrainingArguments",
    "transformers.training_args.TrainingArguments", "transformers.training_args_seq2seq.Seq2SeqTrainingArguments",
})

# A use_reentrant value, judged: "true" | "false" | "missing" (absent or None: torch's default) | "unknown"
Verdict = Tuple[str, str]
# What an expression may evaluate to: literal nodes, one per path (a name's bindings, an if-expression's
# branches); None stands for a path that is not a literal (a parameter, a call).
Expand = Callable[[ast.AST], List[Optional[ast.AST]]]
_SAME = frozenset({"missing", "false"})


def combine(verdicts: List[Verdict], node: ast.AST) -> Verdict:
    """One verdict for a value with several paths: a path that runs reentrant (True, or torch's default) is
    reported, a value False on every path is fine, anything else is decided at run time."""
    if len(verdicts) == 1:
        return verdicts[0]
    states = {state for state, _ in verdicts}
    if "true" in states:
        return "true", f"True on one of its paths ({describe(node)})"
    if "missing" in states:
        return "missing", next(text for state, text in verdicts if state == "missing")
    if states == {"false"}:
        return "false", "False"
    return "unknown", describe(node)


def _paths(node: ast.AST, expand: Optional[Expand]) -> List[Optional[ast.AST]]:
    return expand(node) if expand is not None else [node]


def _literal(node: ast.AST, expand: Optional[Expand] = None) -> Verdict:
    verdicts = []
    for path in _paths(node, expand):
        if isinstance(path, ast.Constant) and path.value is None:
            verdicts.append(("missing", "None"))
        elif isinstance(path, ast.Constant) and isinstance(path.value, bool):
            verdicts.append(("true" if path.value else "false", repr(path.value)))
        else:
            verdicts.append(("unknown", describe(node)))
    return combine(verdicts, node)


def _dict_items(node: ast.AST) -> Optional[List[Tuple[Optional[str], ast.expr]]]:
    """(key, value) pairs of a dict literal or `dict(k=v)`; key None for `**x`; None if not a literal."""
    if isinstance(node, ast.Dict):
        items: List[Tuple[Optional[str], ast.expr]] = []
        for key, value in zip(node.keys, node.values):
            if key is None:
                items.append((None, value))
            elif isinstance(key, ast.Constant) and isinstance(key.value, str):
                items.append((key.value, value))
            else:
                return None
        return items
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
        return [(k.arg, k.value) for k in node.keywords]
    return None


def judge_mapping(node: ast.AST, key: str = "use_reentrant", expand: Optional[Expand] = None) -> Verdict:
    """Look `key` up in an expression used as keyword arguments, on each of its paths (a dict literal; anything
    else is unknown). `expand` follows names to what they are bound to, when the caller can tell."""
    verdicts = []
    for path in _paths(node, expand):
        items = _dict_items(path) if path is not None else None
        if items is None:
            verdicts.append(("unknown", describe(node)))
            continue
        verdict: Verdict = ("missing", "")
        for item_key, value in items:
            if item_key == key:
                verdict = _literal(value, expand)
            elif item_key is None:
                nested = judge_mapping(value, key, expand)
                if nested[0] != "missing":
                    verdict = nested
        verdicts.append(verdict)
    return combine(verdicts, node)


def judge_keywords(keywords: Sequence[ast.keyword], positional: Sequence[ast.AST] = (),
                   index: Optional[int] = None, literal: Optional[Expand] = None) -> Verdict:
    """The effective use_reentrant of a call: the last explicit keyword or **mapping that sets it wins."""
    verdict: Verdict = ("missing", "")
    if index is not None:
        if len(positional) > index and not any(isinstance(a, ast.Starred) for a in positional[: index + 1]):
            verdict = _literal(positional[index], literal)
        elif any(isinstance(a, ast.Starred) for a in positional):
            verdict = ("unknown", "*" + describe(next(a for a in positional if isinstance(a, ast.Starred)).value))
    explicit = next((k for k in keywords if k.arg == "use_reentrant"), None)
    if explicit is not None:
        # a **mapping cannot override it: Python raises TypeError on the duplicate keyword instead
        return _literal(explicit.value, literal)
    for keyword in keywords:
        if keyword.arg is None:
            nested = judge_mapping(keyword.value, expand=literal)
            if nested[0] == "unknown":
                verdict = ("unknown", "**" + nested[1])
            elif nested[0] != "missing":
                verdict = nested
    return verdict


def sets_reentrant(keywords: Sequence[ast.keyword]) -> bool:
    return judge_keywords(keywords)[0] != "missing"


class CheckpointRule(FileCheck):
    """DFD101-103 on calls of torch.utils.checkpoint's functions, and DFD101/103/104 on Hugging Face's switch."""

    def __init__(self, ctx: FileContext, graph: Optional[ModuleGraph]) -> None:
        super().__init__(ctx, graph)
        # partial(checkpoint, ...) without use_reentrant: reported where it is made unless calls through a
        # name bound to it are seen (those calls are judged instead).
        self._bare_partials: Dict[ast.Call, str] = {}
        self._called_partials: Set[ast.Call] = set()
        # `kwargs["use_reentrant"] = value`, `gc_kwargs["gradient_checkpointing_kwargs"] = ...` on a name, seen so
        # far: (scope, name) -> [(key, value)], key None when it is not a constant
        self._subscript_sets: Dict[Tuple[int, str], List[Tuple[Optional[str], ast.expr]]] = {}
        # TrainingArguments(gradient_checkpointing=True) without kwargs: judged at the end, because the file may
        # set `args.gradient_checkpointing_kwargs = ...` after building them.
        self._training_arguments: List[Tuple[ast.Call, str, str]] = []  # (call, class, the switch as spelled)
        self._assigns_hf_kwargs = False
        self._values = Values(ctx, self._augment)

    def _literal_in(self, scope: Scope, line: int) -> Expand:
        """Follow an expression to every value it may have (scan/values.py: names, parameter defaults, fields of
        local classes, dict subscripts, getattr, if-expressions), plus a dict's later `name["use_reentrant"] = ...`
        and `name.setdefault(...)` in the same scope."""
        values = self._values

        def expand(node: Optional[ast.AST]) -> List[Optional[ast.AST]]:
            return values.paths(node, scope, line)
        return expand

    def _augment(self, binding: Binding, name: str, value: Optional[ast.AST]) -> Optional[List[Optional[ast.AST]]]:
        """A dict bound to `name` with `name[key] = v` / `name.setdefault(key, v)` later in its scope: those keys
        are part of its value."""
        later = self._subscript_sets.get((id(binding.scope), name)) if name else None
        if not later:
            return None
        if binding.kind == "param":
            if not all(key is not None for key, _ in later):
                return None
            # `**kwargs` given `kwargs.setdefault("use_reentrant", True)` or `kwargs[...] = ...`: what the
            # function sets is the value unless a caller passes the key (no caller is visible here)
            return [ast.Dict(keys=[ast.Constant(key) for key, _ in later], values=[v for _, v in later])]
        if not isinstance(value, ast.expr) or _dict_items(value) is None:
            return None
        if any(key is None for key, _ in later):
            return [None]  # a key computed at run time: the dict is unknown
        return [ast.Dict(keys=[None] + [ast.Constant(key) for key, _ in later], values=[value] + [v for _, v in later])]

    def visit_dict(self, node: ast.Dict, scope: Scope) -> None:
        """`{"gradient_checkpointing_kwargs": {"use_reentrant": True}, ...}`: a config written as a dict."""
        if not self.ctx.on_candidate_line(node):
            return
        for key, value in zip(node.keys, node.values):
            if _constant_key(key) in HF_KWARGS_KEYS and not (isinstance(value, ast.Constant) and value.value is None):
                verdict = judge_mapping(value, expand=self._literal_in(scope, node.lineno))
                self._report_hf(value, verdict, enable=False, spelled=f"{{{_constant_key(key)!r}: ...}}")

    def visit_assign(self, node: Union[ast.Assign, ast.AnnAssign], scope: Scope) -> None:
        """`args.gradient_checkpointing_kwargs = {...}` and `...["use_reentrant"] = value`, as real trainers
        write them (PEFT + ZeRO-3 + checkpointing force it this way)."""
        value = node.value
        if not self.ctx.on_candidate_line(node) or value is None:
            return
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        literal = self._literal_in(scope, node.lineno)
        for target in targets:
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                self._record_subscript(target.value, _constant_key(target.slice), value, scope, node.lineno)
            if _hf_kwargs_target(target):
                self._assigns_hf_kwargs = True
                if not (isinstance(value, ast.Constant) and value.value is None):
                    self._report_hf(node, judge_mapping(value, expand=literal), enable=False,
                                    spelled=describe(target))
            elif isinstance(target, ast.Subscript):
                owner, key = target.value, _constant_key(target.slice)
                if key == "use_reentrant" and _hf_kwargs_target(owner):
                    self._assigns_hf_kwargs = True
                    self._report_hf(node, _literal(value, literal), enable=False, spelled=describe(target))

    def _record_subscript(self, owner: ast.Name, key: Optional[str], value: ast.expr, scope: Scope, line: int) -> None:
        binding = self.ctx.resolver.value_binding(owner, scope, line)
        if binding is not None:
            self._subscript_sets.setdefault((id(binding.scope), owner.id), []).append((key, value))

    def visit_call(self, node: ast.Call, scope: Scope) -> None:
        if not self.ctx.on_candidate_line(node):
            return
        resolver = self.ctx.resolver
        line = node.lineno
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "setdefault" and isinstance(func.value, ast.Name) \
                and len(node.args) == 2:
            # `kwargs.setdefault("use_reentrant", True)`: part of the mapping's value, like a subscript assignment
            self._record_subscript(func.value, _constant_key(node.args[0]), node.args[1], scope, line)
            return
        literal = self._literal_in(scope, line)
        enable = self._enable_method(node.func, scope, line)
        if enable is not None:
            if not _project_method(self.ctx, enable.value, enable.attr, scope, line):
                self._hf_enable(node, literal, implicit_reentrant=enable.attr == HF_ENABLE)
            return
        for keyword in node.keywords:
            if keyword.arg in HF_KWARGS_KEYS:
                self._hf_kwargs(node, keyword.value, literal)
        target = resolver.dotted(node.func, scope, line)
        if target == REENTRANT_FUNCTION:
            self._report(node, node.func, target, ("true", "True (CheckpointFunction is the reentrant variant)"),
                         None)
            return
        if target is not None and (
                target in TRAINING_ARGUMENTS or target.startswith("trl.") and target.endswith("Config")):
            self._training_arguments_call(node, target, literal)
            return
        if target in CHECKPOINT_FUNCTIONS:
            verdict = judge_keywords(node.keywords, node.args, _POSITIONAL_INDEX.get(target), literal)
            self._report(node, node.func, target, verdict, None)
            return
        if target == CHECKPOINT_WRAPPER:
            self._wrapper(node, node.func, node.keywords, node.args[1:], literal)
            return
        if resolver.is_partial_call(node, scope, line):
            inner = resolver.dotted(node.args[0], scope, line)
            if inner == CHECKPOINT_WRAPPER:
                self._wrapper(node, node.args[0], node.keywords, node.args[2:], literal)
                return
            if inner in CHECKPOINT_FUNCTIONS:
                verdict = judge_keywords(node.keywords, node.args[1:], _offset(inner, 1), literal)
                if verdict[0] == "missing":
                    self._bare_partials[node] = inner
                else:
                    self._report(node, node.args[0], inner, verdict, None)
            return
        binding = resolver.value_binding(node.func, scope, line)
        if binding is None or binding.kind != "assign":
            return
        partial = binding.node
        if not isinstance(partial, ast.Call) or not resolver.is_partial_call(partial, binding.scope, binding.line):
            return
        inner = resolver.dotted(partial.args[0], binding.scope, binding.line)
        if inner not in CHECKPOINT_FUNCTIONS:
            return
        self._called_partials.add(partial)
        if sets_reentrant(partial.keywords) and not sets_reentrant(node.keywords):
            return  # judged once, where the partial was made
        verdict = judge_keywords(
            list(partial.keywords) + list(node.keywords), list(partial.args[1:]) + list(node.args),
            _POSITIONAL_INDEX.get(inner), literal,
        )
        self._report(node, node.func, inner, verdict, partial.lineno)

    def _enable_method(self, func: ast.AST, scope: Scope, line: int) -> Optional[ast.Attribute]:
        """`model.gradient_checkpointing_enable` as the called function: spelled out, fetched with `getattr(model,
        "gradient_checkpointing_enable")`, or either bound to a local name first."""
        if isinstance(func, ast.Attribute):
            return func if func.attr in (HF_ENABLE, HF_ENABLE_NON_REENTRANT) else None
        if not isinstance(func, (ast.Name, ast.Call)):
            return None
        fetched = getattr_attribute(func)
        paths = [fetched] if fetched is not None else self._values.paths(func, scope, line)
        return next((path for path in paths if isinstance(path, ast.Attribute)
                     and path.attr in (HF_ENABLE, HF_ENABLE_NON_REENTRANT)), None)

    def _wrapper(self, node: ast.Call, func: ast.AST, keywords: Sequence[ast.keyword], after_module: Sequence[ast.AST],
                 literal: Expand) -> None:
        """checkpoint_wrapper(module, checkpoint_impl=...) or partial(checkpoint_wrapper, checkpoint_impl=...): a
        CheckpointImpl.REENTRANT on some path is DFD101; left out, it is NO_REENTRANT."""
        value: Optional[ast.AST] = next((k.value for k in keywords if k.arg == IMPL_KEYWORD), None)
        if value is None and after_module and not isinstance(after_module[0], ast.Starred):
            value = after_module[0]
        if value is None:
            return
        verdicts: List[Verdict] = []
        for path in literal(value):
            if isinstance(path, ast.Attribute) and path.attr == "REENTRANT":
                verdicts.append(("true", describe(path)))
            elif isinstance(path, ast.Attribute) and path.attr == "NO_REENTRANT":
                verdicts.append(("false", "NO_REENTRANT"))
            else:
                verdicts.append(("unknown", describe(value)))
        self._report(node, func, CHECKPOINT_WRAPPER, combine(verdicts, value), None, keyword=IMPL_KEYWORD)

    def finish(self) -> None:
        for partial, inner in self._bare_partials.items():
            if partial not in self._called_partials:
                self._report(partial, partial.args[0], inner, ("missing", ""), None)
        if not self._assigns_hf_kwargs:
            for node, target, switch in self._training_arguments:
                self._report_hf(node, ("missing", ""), enable=True,
                                spelled=f"{target.rsplit('.', 1)[-1]}(gradient_checkpointing={switch})",
                                via_trainer=True, trl=target.startswith("trl."))

    def _training_arguments_call(self, node: ast.Call, target: str, literal: Expand) -> None:
        """gradient_checkpointing=True with no kwargs reaches gradient_checkpointing_enable(None) in Trainer."""
        switch = next((k.value for k in node.keywords if k.arg == "gradient_checkpointing"), None)
        if switch is None or _literal(switch, literal)[0] != "true":
            return
        if any(k.arg in HF_KWARGS_KEYS or k.arg is None for k in node.keywords):
            return  # judged as keywords above, or decided by **mapping
        # a value that is not the literal True is named with where True comes from (a default, a field)
        spelled = "True" if isinstance(switch, ast.Constant) else f"{describe(switch)}, True on one of its paths"
        self._training_arguments.append((node, target, spelled))

    def _report(self, node: ast.Call, func: ast.AST, target: str, verdict: Verdict,
                partial_line: Optional[int], keyword: str = "use_reentrant") -> None:
        state, value = verdict
        if state == "false":
            return
        spelled = describe(func)
        evidence: Dict[str, object] = {"call": spelled, "resolves_to": target, keyword: value or None}
        if partial_line is not None:
            evidence["partial_line"] = partial_line
        named = f"{spelled}(...)" if spelled == target else f"{spelled}(...) ({target})"
        if state == "true":
            rule = CHECKPOINT_USE_REENTRANT_TRUE
            fix = "pass use_reentrant=False" if keyword == "use_reentrant" else \
                f"use {keyword}=CheckpointImpl.NO_REENTRANT (the default)"
            message = f"{named} with {keyword}={value} runs the reentrant checkpoint; {fix}"
        elif state == "missing":
            rule = CHECKPOINT_USE_REENTRANT_IMPLICIT
            message = (
                f"{named} without use_reentrant: torch warns and runs the reentrant variant; "
                "pass use_reentrant=False"
            )
        else:
            rule = CHECKPOINT_USE_REENTRANT_UNKNOWN
            message = f"{named} with {keyword}={value}: which variant runs is decided at run time"
        self.ctx.report(rule, node, message, evidence)

    def _hf_enable(self, node: ast.Call, literal: Expand, implicit_reentrant: bool) -> None:
        value = next((k.value for k in node.keywords if k.arg in HF_KWARGS_KEYS), None)
        if value is None and node.args:
            value = node.args[0]
        if value is None and any(k.arg is None for k in node.keywords):
            mapping = next(k for k in node.keywords if k.arg is None).value
            verdict: Verdict = _enable_mapping(mapping, literal, implicit_reentrant)
            if verdict[0] == "false" or verdict == ("missing", "") and not implicit_reentrant:
                return
        elif value is None or isinstance(value, ast.Constant) and value.value is None:
            if not implicit_reentrant:
                return  # activation_checkpointing_enable() defaults to use_reentrant=False
            verdict = ("missing", "")
        else:
            verdict = judge_mapping(value, expand=literal)
            if verdict[0] == "missing":
                verdict = ("missing", "given")
        self._report_hf(node, verdict, enable=True, spelled=describe(node.func) + "(...)")

    def _hf_kwargs(self, node: ast.Call, value: ast.AST, literal: Expand) -> None:
        if isinstance(value, ast.Constant) and value.value is None:
            return
        self._report_hf(node, judge_mapping(value, expand=literal), enable=False,
                        spelled=describe(node.func) + "(...)")

    def _report_hf(self, node: Located, verdict: Verdict, enable: bool, spelled: str,
                   via_trainer: bool = False, trl: bool = False) -> None:
        """`spelled`: the call or assignment as the message names it (a TrainingArguments class via_trainer; `trl`:
        one of TRL's configs, which default to use_reentrant=False from TRL_NON_REENTRANT)."""
        state, value = verdict
        evidence: Dict[str, object] = {"call": spelled, "use_reentrant": value if value not in ("", "given") else None}
        if state == "true":
            self.ctx.report(CHECKPOINT_USE_REENTRANT_TRUE, node,
                            f"{spelled} sets use_reentrant={value} for Hugging Face gradient checkpointing; "
                            "use False",
                            evidence)
        elif state == "unknown":
            self.ctx.report(CHECKPOINT_USE_REENTRANT_UNKNOWN, node,
                            f"{spelled}: use_reentrant for Hugging Face gradient checkpointing is {value}, decided "
                            "at run time", evidence)
        elif state == "missing" and enable:
            fix = 'pass gradient_checkpointing_kwargs={"use_reentrant": False}'
            if value == "given":
                message = (f"{spelled} passes gradient_checkpointing_kwargs without use_reentrant: every "
                           "transformers release hands them to torch.utils.checkpoint as they are, and torch's "
                           f"default is the reentrant variant; add \"use_reentrant\": False")
                self.ctx.report(HF_GRADIENT_CHECKPOINTING_IMPLICIT, node, message, evidence)
                return
            version = self.ctx.transformers_version
            reentrant = hf_releases.default_is_reentrant(version)
            evidence["transformers_installed"] = version
            what = "with no gradient_checkpointing_kwargs (Trainer enables it with None)" if via_trainer else \
                "without use_reentrant in gradient_checkpointing_kwargs"
            message = f"{spelled} {what} {hf_releases.implicit_default(version)}; {fix}"
            trl_release = hf_releases.parse(hf_releases.installed_release("trl")) if trl else None
            if trl_release is not None and trl_release >= TRL_NON_REENTRANT:
                reentrant = False
                message = (f"{message} (but trl {hf_releases.installed_release('trl')}, installed here, defaults it to "
                           f"use_reentrant=False, as every trl from {'.'.join(map(str, TRL_NON_REENTRANT))} does)")
            self.ctx.report(HF_GRADIENT_CHECKPOINTING_IMPLICIT, node, message, evidence,
                            severity=Severity.INFO if reentrant is False else None)


def _enable_mapping(mapping: ast.AST, expand: Expand, implicit_reentrant: bool) -> Verdict:
    """`enable(**mapping)`: on each path, the mapping either leaves the kwargs out (the release's default) or
    passes kwargs, judged for use_reentrant."""
    verdicts: List[Verdict] = []
    for path in expand(mapping):
        items = _dict_items(path) if path is not None else None
        if items is None:
            verdicts.append(("unknown", "**" + describe(mapping)))
            continue
        given = [value for key, value in items if key in HF_KWARGS_KEYS]
        if not given or isinstance(given[-1], ast.Constant) and given[-1].value is None:
            verdicts.append(("missing", "") if implicit_reentrant else ("false", "False"))
            continue
        verdict = judge_mapping(given[-1], expand=expand)
        verdicts.append(("missing", "given") if verdict[0] == "missing" else verdict)
    return combine(verdicts, mapping)


def _project_method(ctx: FileContext, receiver: ast.AST, name: str, scope: Scope, line: int) -> bool:
    """Whether `receiver.name(...)` calls a method this file defines that is not Hugging Face's (a framework's
    own gradient_checkpointing_enable that sets flags or forwards to Hugging Face's, where the forwarded call
    is judged): `self.` in a class that defines it, or an instance of such a class built here, without a
    gradient_checkpointing_kwargs parameter. `super().` is the parent's."""
    table = ctx.table
    owner = table.self_class(receiver, scope, line)
    if owner is None:
        cls = ctx.resolver.instance_class(receiver, scope, line)
        owner = table.by_qualname.get(cls.qualname) if isinstance(cls, LocalClass) else None
    if owner is None:
        return False
    defs = [b.node for b in table.bindings(owner).get(name, ()) if b.kind == "def"]
    # Hugging Face's own implementation (PreTrainedModel calling self.gradient_checkpointing_enable(), a model
    # overriding it with the same signature) takes gradient_checkpointing_kwargs: that one is judged.
    return bool(defs) and not any(
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
            arg.arg in HF_KWARGS_KEYS for arg in node.args.args + node.args.kwonlyargs) for node in defs)


def _hf_kwargs_target(node: ast.AST) -> bool:
    """`args.gradient_checkpointing_kwargs` or `cfg["gradient_checkpointing_kwargs"]` (an assignment target)."""
    if isinstance(node, ast.Attribute):
        return node.attr in HF_KWARGS_KEYS
    return isinstance(node, ast.Subscript) and _constant_key(node.slice) in HF_KWARGS_KEYS


def _constant_key(node: Optional[ast.AST]) -> Optional[str]:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _offset(target: str, consumed: int) -> Optional[int]:
    index = _POSITIONAL_INDEX.get(target)
    return None if index is None else index - consumed
