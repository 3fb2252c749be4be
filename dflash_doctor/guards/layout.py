"""Read, from a torch's own source, how the compile wrapper's nested-FX-trace guard decides to raise.

Steps, each from the AST (nothing is imported, no version table is consulted):

1. in `_dynamo/eval_frame.py`, the `raise RuntimeError("Detected that you are using FX to symbolically trace ...")`
   and the predicate called in the `if` around it (resolving a local alias bound when the wrapper is created);
2. in the module defining that predicate (`fx/_symbolic_trace.py`), the state it reads: a module global written
   under `global` (by `Tracer.trace`), or an attribute of a `threading.local()` object;
3. where `torch.compiler.is_compiling()`'s flag lives (the predicate's own call when it makes one, 2.9+), and
   whether Dynamo's per-frame compile (`_dynamo/convert_frame.py`) enters a context manager that sets it True
   for the whole compile (2.13+: it masks the guard, and every thread sees it);
4. the backward compile and Dynamo's compile_lock (backward.py): the compile-lock deadlock's ingredients;
5. torch.fx's tracing patches (patcher.py): nn.Module patched on the class, the patcher a module global.

Anything not found leaves the corresponding part None/unknown and says so in `notes`.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Set, Tuple, Union

from dflash_doctor.guards.backward import BackwardCompile, read_backward
from dflash_doctor.guards.config_storage import ConfigStorage, read_config_storage
from dflash_doctor.guards.patcher import FxPatches, read_fx_patches
from dflash_doctor.guards.pyindex import FUNCTION_DEFS, FunctionNode, Index, Module, Variable, dotted, own_nodes
from dflash_doctor.guards.torch_sources import DirectoryTree, MappingTree, SourceTree, parse_bundle

GUARD_MESSAGE = "Detected that you are using FX to symbolically trace"
EVAL_FRAME = "_dynamo/eval_frame.py"
CONVERT_FRAME = "_dynamo/convert_frame.py"
VERSION_FILE = "version.py"
IS_COMPILING = "torch.compiler.is_compiling"
MODULE_GLOBAL, THREAD_LOCAL, UNKNOWN = "module-global", "thread-local", "unknown"
_MAX_SNIPPET = 14
FX_ROLE = "FX-tracing flag"
_BUILTINS = {"isinstance", "getattr", "hasattr", "callable", "len", "bool", "type"}

SourceLines = Tuple[Tuple[int, str], ...]
# A module variable a function reads: (variable, attribute read from it or None, the function reading it)
Read = Tuple[str, Optional[str], FunctionNode]


@dataclass(frozen=True)
class GuardSite:
    file: str
    line: int  # the `raise`
    function: str  # the wrapper the raise lives in (compile_wrapper)
    if_line: int
    predicate: str  # as called in the `if`
    predicate_qualname: Optional[str]
    bound_at_wrap: bool  # the predicate is looked up once, when the wrapper is created
    source: SourceLines


@dataclass(frozen=True)
class FlagSite:
    name: str
    storage: str  # module-global | thread-local
    file: str
    line: int
    attribute: Optional[str]  # for thread-local objects: the attribute holding the flag
    reader: str  # the function that reads it (the predicate, or is_compiling)
    source: SourceLines  # the flag's definition, then the reader's `def` and its lines that use the flag
    writer: Optional[str] = None  # Tracer.trace
    writer_line: Optional[int] = None
    restores_saved_value: bool = False  # save/set/restore: out-of-order exits leave it set


@dataclass(frozen=True)
class MaskingSite:
    file: str
    line: int
    function: str
    context: str


@dataclass(frozen=True)
class Layout:
    root: str
    torch_version: Optional[str] = None
    cuda: Optional[str] = None
    hip: Optional[str] = None
    guard: Optional[GuardSite] = None
    fx_flag: Optional[FlagSite] = None
    consults_is_compiling: bool = False
    compiling_flag: Optional[FlagSite] = None
    masking: Optional[MaskingSite] = None
    # Whether a Dynamo compile sets the compiling flag True (None: convert_frame.py or the flag not readable).
    compile_sets_compiling_flag: Optional[bool] = None
    backward: BackwardCompile = field(default_factory=BackwardCompile)
    fx_patches: FxPatches = field(default_factory=FxPatches)
    # Where an assigned compile setting lives: per thread (a ContextVar, 2.12+) or process-wide.
    compile_settings: ConfigStorage = field(default_factory=ConfigStorage)
    notes: Tuple[str, ...] = field(default_factory=tuple)
    unknown_reason: Optional[str] = None  # why the FX flag's storage could not be told, when it could not

    @property
    def fx_flag_storage(self) -> str:
        if self.guard is None or self.fx_flag is None:
            return UNKNOWN
        return self.fx_flag.storage

    @property
    def masked_during_compile(self) -> bool:
        return bool(self.consults_is_compiling and self.compiling_flag and self.masking)

    @property
    def known(self) -> bool:
        return self.fx_flag_storage != UNKNOWN


def read_layout(torch_root: Path) -> Layout:
    """The guard layout of the torch package in `torch_root` (the folder holding `_dynamo/`, `fx/`...)."""
    return analyze(DirectoryTree(Path(torch_root)))


def read_layout_text(bundle: str) -> Layout:
    """The layout of stand-in sources given as one `# ==> PATH <==` bundle (rule examples, tests)."""
    return analyze(MappingTree(parse_bundle(bundle)))


def analyze(tree: SourceTree) -> Layout:
    return _Analysis(tree).run()


class _Analysis:
    def __init__(self, tree: SourceTree):
        self.tree = tree
        self.index = Index(tree)
        self.notes: List[str] = []
        self.unknown_reason: Optional[str] = None

    def _unknown(self, reason: str) -> None:
        """Note why the FX flag cannot be told (the first such reason is the one reported)."""
        self.notes.append(reason)
        self.unknown_reason = self.unknown_reason or reason

    def run(self) -> Layout:
        version, cuda, hip = self._version()
        compiling_reader = IS_COMPILING
        guard, predicate_def = self._guard()
        fx_flag: Optional[FlagSite] = None
        consults_is_compiling = False
        if predicate_def is not None:
            module, func = predicate_def
            reads, calls = self._reads(module, func)
            fx_flag = self._flag(module, func, reads, role=FX_ROLE)
            compiling_calls = [name for name in calls if name.rsplit(".", 1)[-1] == "is_compiling"]
            if compiling_calls:
                consults_is_compiling = True
                self.notes.append(f"{func.name} also requires `not {compiling_calls[0]}()`")
                compiling_reader = compiling_calls[0]
        # Read whether or not the guard consults it: other threads' code branches on is_compiling() too.
        flag = self._compiling_flag(compiling_reader)
        masking, compile_sets_flag = self._masking(flag) if flag is not None else (None, None)
        backward = read_backward(self.index)
        fx_patches = read_fx_patches(self.index)
        compile_settings = read_config_storage(self.index)
        for relpath in self.index.unreadable:
            if relpath != EVAL_FRAME:  # _guard already said so
                self.notes.append(f"{self.tree.display_path(relpath)} does not parse")
        return Layout(
            root=self.tree.label, torch_version=version, cuda=cuda, hip=hip, guard=guard, fx_flag=fx_flag,
            consults_is_compiling=consults_is_compiling, compiling_flag=flag, masking=masking,
            compile_sets_compiling_flag=compile_sets_flag, backward=backward, fx_patches=fx_patches,
            compile_settings=compile_settings,
            notes=tuple(self.notes),
            unknown_reason=None if fx_flag else (self.unknown_reason or "the FX-tracing flag was not found"),
        )

    # -- 0. version.py -------------------------------------------------------------------------------------
    def _version(self) -> Tuple[Optional[str], Optional[str], Optional[str]]:
        module = self.index.module(VERSION_FILE)
        if module is None:
            return None, None, None
        values: Dict[str, str] = {}
        for name in ("__version__", "cuda", "hip"):
            stmt = module.variables.get(name)
            if stmt is not None and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                values[name] = stmt.value.value
        return values.get("__version__"), values.get("cuda"), values.get("hip")

    # -- 1. the raise and its predicate --------------------------------------------------------------------
    def _guard(self) -> Tuple[Optional[GuardSite], Optional[Tuple[Module, FunctionNode]]]:
        module = self.index.module(EVAL_FRAME)
        if module is None:
            unreadable = EVAL_FRAME in self.index.unreadable
            self._unknown(f"{self.tree.display_path(EVAL_FRAME)} does not parse" if unreadable
                          else f"no readable {self.tree.display_path(EVAL_FRAME)}")
            return None, None
        raises = [node for node in ast.walk(module.tree) if isinstance(node, ast.Raise) and _is_guard_raise(node)]
        if not raises:
            self._unknown(f"no `raise RuntimeError(\"{GUARD_MESSAGE} ...\")` in {self.tree.display_path(EVAL_FRAME)}")
            return None, None
        raises.sort(key=lambda node: (_function_name(module, node) != "compile_wrapper", node.lineno))
        raise_node = raises[0]
        function = _function_name(module, raise_node) or "<module>"
        found = self._predicate_call(module, raise_node)
        if found is None:
            self._unknown(f"the raise at line {raise_node.lineno} is not inside an `if` that calls a predicate")
            return None, None
        if_node, call = found
        scopes = module.enclosing_functions(call)
        qualname, binding_scope = self.index.qualname(call.func, module, scopes)
        # A binding in the wrapper's own body is re-read each call; one in an enclosing function is not.
        bound_at_wrap = binding_scope is not None and binding_scope is not scopes[0]
        first = if_node.lineno
        last = min(if_node.end_lineno or raise_node.lineno, max(raise_node.end_lineno or raise_node.lineno,
                                                                first + _MAX_SNIPPET - 1))
        guard = GuardSite(
            file=self.tree.display_path(EVAL_FRAME), line=raise_node.lineno, function=function,
            if_line=if_node.lineno, predicate=dotted(call.func) or "?", predicate_qualname=qualname,
            bound_at_wrap=bound_at_wrap, source=tuple(module.source_lines(first, last)),
        )
        self.notes.append(
            f"{function} raises at {guard.file}:{guard.line} when `{guard.predicate}()` is true"
            + (f" ({qualname}, looked up once when the wrapper is created)" if guard.bound_at_wrap
               else f" ({qualname})" if qualname else "")
        )
        if qualname is None:
            self._unknown(f"could not resolve what `{guard.predicate}` refers to")
            return guard, None
        definition = self.index.function_definition(qualname)
        if definition is None:
            self._unknown(f"no readable definition of {qualname}")
            return guard, None
        return guard, definition

    def _predicate_call(self, module: Module, raise_node: ast.Raise) -> Optional[Tuple[ast.If, ast.Call]]:
        """The innermost enclosing `if` whose test calls something (config flags are attributes, not calls)."""
        child: ast.AST = raise_node
        node = module.parents.get(raise_node)
        while node is not None and not isinstance(node, FUNCTION_DEFS):
            if isinstance(node, ast.If) and child in node.body:
                calls = [c for c in ast.walk(node.test) if isinstance(c, ast.Call) and dotted(c.func)
                         and dotted(c.func) not in _BUILTINS]
                if calls:
                    return node, calls[0]
            child, node = node, module.parents.get(node)
        return None

    # -- 2. the state a predicate reads --------------------------------------------------------------------
    def _reads(self, module: Module, func: FunctionNode, depth: int = 0) -> Tuple[List[Read], List[str]]:
        """(variable, attribute read, reading function) for each module variable a function reads, following
        calls to same-module helpers, and the qualified names of everything else it calls."""
        local_names = _locals(func)
        reads: List[Read] = []
        calls: List[str] = []
        for node in own_nodes(func):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in module.variables \
                    and node.id not in local_names:
                reads.append((node.id, _attribute_read(module, node), func))
            elif isinstance(node, ast.Call):
                qualname, _ = self.index.qualname(node.func, module)
                if qualname is None:
                    continue
                helper = qualname[len(module.name) + 1:] if qualname.startswith(module.name + ".") else None
                if helper in module.functions and depth < 3:
                    more_reads, more_calls = self._reads(module, module.functions[helper], depth + 1)
                    reads += more_reads
                    calls += more_calls
                elif helper is None:
                    calls.append(qualname)
        return reads, calls

    def _flag(self, module: Module, reader: FunctionNode, reads: List[Read], role: str) -> Optional[FlagSite]:
        missing: Callable[[str], None] = self._unknown if role == FX_ROLE else self.notes.append
        if not reads:
            missing(f"{module.name}.{reader.name} reads no module state this tool recognises")
            return None
        candidates = []
        for name, attribute, reading_func in dict.fromkeys(reads):
            storage = self.index.variable_kind(module, name)
            writers = _writers(module, name, attribute if storage == THREAD_LOCAL else None)
            candidates.append((name, attribute, storage, writers, reading_func))
        # The flag is the state some function writes; prefer the tracer's own writer.
        candidates.sort(key=lambda c: (not c[3], not any(w[0].endswith("Tracer.trace") for w in c[3])))
        name, attribute, storage, writers, reading_func = candidates[0]
        if storage == THREAD_LOCAL and attribute is None:
            missing(f"{name} is thread-local but {reader.name} reads it as a whole: not recognised")
            return None
        writers.sort(key=lambda w: not w[0].endswith("Tracer.trace"))
        stmt = module.variables[name]
        display = self.tree.display_path(module.relpath)
        site = FlagSite(
            name=name, storage=storage, file=display, line=stmt.lineno, attribute=attribute,
            reader=f"{module.name}.{reader.name}",
            source=_flag_source(module, stmt, reader, reading_func, name),
            writer=writers[0][0] if writers else None, writer_line=writers[0][1] if writers else None,
            restores_saved_value=bool(writers and writers[0][2]),
        )
        shown = f"{name}.{attribute}" if storage == THREAD_LOCAL else name
        how = (f", written by {site.writer} (line {site.writer_line})" if site.writer
               else ", no writer found in its module")
        if site.restores_saved_value:
            how += " with save/set/restore"
        self.notes.append(f"{role} {shown} ({display}:{site.line}) is {storage}{how}")
        return site

    # -- 3. the compiling flag and the compile that holds it -----------------------------------------------
    def _compiling_flag(self, qualname: str) -> Optional[FlagSite]:
        definition = self.index.function_definition(qualname)
        if definition is None:
            self.notes.append(f"no readable definition of {qualname}")
            return None
        module, func = definition
        reads, _ = self._reads(module, func)
        return self._flag(module, func, reads, role="compiling flag")

    def _masking(self, flag: FlagSite) -> Tuple[Optional[MaskingSite], Optional[bool]]:
        convert = self.index.module(CONVERT_FRAME)
        if convert is None:
            self.notes.append(f"no readable {self.tree.display_path(CONVERT_FRAME)}: masking not checked")
            return None, None
        flag_qualname = flag.reader.rsplit(".", 1)[0] + "." + flag.name
        for call in _context_manager_calls(convert):
            scopes = convert.enclosing_functions(call)
            qualname, _ = self.index.qualname(call.func, convert, scopes)
            definition = self.index.function_definition(qualname, mentions=flag.name) if qualname else None
            if qualname is None or definition is None:
                continue
            if _writes_true(self.index, definition[0], definition[1], flag, flag_qualname):
                site = MaskingSite(
                    file=self.tree.display_path(CONVERT_FRAME), line=call.lineno,
                    function=convert.qualified_def_name(scopes[0]) if scopes else "<module>", context=qualname,
                )
                self.notes.append(
                    f"Dynamo's {site.function} ({site.file}:{site.line}) enters {qualname}, which sets "
                    f"{flag.name} True for the whole compile"
                )
                return site, True
        self.notes.append(f"nothing in {self.tree.display_path(CONVERT_FRAME)} sets {flag.name} during a compile")
        return None, False


def _flag_source(module: Module, definition: Variable, reader: FunctionNode, reading_func: FunctionNode,
                 name: str) -> SourceLines:
    """The flag's definition, then the `def` of the function that reads it (a helper of the predicate when the
    predicate delegates) and its lines using the flag."""
    lines = module.source_lines(definition.lineno, definition.lineno)
    words = {name, reading_func.name}
    for func in dict.fromkeys((reader, reading_func)):
        body = module.source_lines(func.lineno, func.end_lineno or func.lineno)
        lines += body[:1] + [(n, text) for n, text in body[1:] if any(word in text for word in words)][:4]
    return tuple(sorted(dict.fromkeys(lines)))


def _is_guard_raise(node: ast.Raise) -> bool:
    exc = node.exc
    if not (isinstance(exc, ast.Call) and dotted(exc.func) == "RuntimeError" and exc.args):
        return False
    message = _string(exc.args[0])
    return message is not None and message.startswith(GUARD_MESSAGE)


def _string(expr: ast.AST) -> Optional[str]:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        left, right = _string(expr.left), _string(expr.right)
        return None if left is None or right is None else left + right
    return None


def _function_name(module: Module, node: ast.AST) -> Optional[str]:
    chain = module.enclosing_functions(node)
    return chain[0].name if chain else None


def _locals(func: FunctionNode) -> Set[str]:
    declared_global = {name for node in own_nodes(func) if isinstance(node, ast.Global) for name in node.names}
    args = func.args
    names = {a.arg for a in args.args + args.kwonlyargs + getattr(args, "posonlyargs", [])}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    names |= {n.id for n in own_nodes(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return names - declared_global


def _attribute_read(module: Module, name_node: ast.Name) -> Optional[str]:
    """`flag_tls.value` or `getattr(flag_tls, "value", False)`: the attribute read from a variable."""
    parent = module.parents.get(name_node)
    if isinstance(parent, ast.Attribute) and parent.value is name_node:
        return parent.attr
    if isinstance(parent, ast.Call) and dotted(parent.func) == "getattr" and parent.args[0] is name_node \
            and len(parent.args) >= 2:
        return _string(parent.args[1])
    return None


def _writers(module: Module, name: str, attribute: Optional[str]) -> List[Tuple[str, int, bool]]:
    """(qualified function, line, restores a saved value) for every function assigning the flag."""
    found = []
    for func in ast.walk(module.tree):
        if not isinstance(func, FUNCTION_DEFS):
            continue
        nodes = list(own_nodes(func))
        declared = any(isinstance(n, ast.Global) and name in n.names for n in nodes)
        sets: List[Union[ast.Assign, ast.Call]] = []
        restores = False
        for node in nodes:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if _is_flag_target(target, name, attribute, declared):
                        sets.append(node)
                        restores = restores or isinstance(node.value, ast.Name)
            elif isinstance(node, ast.Call) and dotted(node.func) == "setattr" and attribute is not None \
                    and len(node.args) == 3 and isinstance(node.args[0], ast.Name) and node.args[0].id == name \
                    and _string(node.args[1]) == attribute:
                sets.append(node)
                restores = restores or isinstance(node.args[2], ast.Name)
        true_sets = [n for n in sets if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                     and n.value.value is True]
        if sets:
            found.append((module.qualified_def_name(func), (true_sets or sets)[0].lineno, restores))
    return found


def _is_flag_target(target: ast.AST, name: str, attribute: Optional[str], declared_global: bool) -> bool:
    if attribute is None:
        return declared_global and isinstance(target, ast.Name) and target.id == name
    return isinstance(target, ast.Attribute) and target.attr == attribute and dotted(target.value) == name


def _context_manager_calls(module: Module) -> Iterator[ast.Call]:
    for node in ast.walk(module.tree):
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if isinstance(item.context_expr, ast.Call):
                    yield item.context_expr
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "enter_context" and node.args and isinstance(node.args[0], ast.Call):
            yield node.args[0]


def _writes_true(index: Index, module: Module, func: FunctionNode, flag: FlagSite, flag_qualname: str) -> bool:
    """Does `func` assign True to the flag (by `global`, through `torch.compiler.<flag>`, or on its TLS object)?"""
    nodes = list(own_nodes(func))
    declared = any(isinstance(n, ast.Global) and flag.name in n.names for n in nodes)
    same_module = flag_qualname.rsplit(".", 1)[0] == module.name
    for node in nodes:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value is True):
            continue
        for target in node.targets:
            if flag.storage == THREAD_LOCAL:
                if isinstance(target, ast.Attribute) and target.attr == flag.attribute:
                    owner, _ = index.qualname(target.value, module)
                    if owner == flag_qualname:
                        return True
            elif isinstance(target, ast.Name) and target.id == flag.name and same_module and declared:
                return True
            elif isinstance(target, ast.Attribute) and index.qualname(target, module)[0] == flag_qualname:
                return True
    return False
