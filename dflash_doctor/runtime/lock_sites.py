"""Which locks a frame names, and which lock object each name is: the deadlock rule's evidence by identity.

A frame's source says which lock expressions matter at its line: the `with` it is entering or the `X.acquire(` it
is blocked in (the lock it waits for, innermost frame only), the `with` blocks around the line and the
`X.acquire()` calls earlier in its function not released since (the locks it holds). Text alone cannot say
whether two frames mean the same lock: three objects each using `self.lock` are three locks (a healthy program
was once killed as deadlocked because their text matched). So every expression is turned into an identity by
whoever can see the objects:

- in the process itself (`run`'s watchdog): the object the expression names in that frame, read without running
  user code (instance and class dicts, plain containers; never a property), checked to be a lock, and a hold
  checked against the lock where it can say (`Lock.locked()`, an RLock's owner);
- from py-spy's `--locals` (`attach`): the address of the local the expression starts from, plus the path;
- from the source alone (a pasted dump): only module globals, by file and name; a local's lock stays unknown.

An expression that cannot be resolved gives no identity and so no wait-for edge: a missed cycle is reported by the
no-progress rule later, a wrong edge would kill a healthy run.
"""
from __future__ import annotations

import ast
import functools
import linecache
import re
from dataclasses import dataclass
from types import FrameType
from typing import Callable, Dict, FrozenSet, List, Optional, Tuple

TORCH_COMPILE_LOCK = "torch compile_lock"
MAX_EXPRESSION = 200  # characters: lock expressions are short; anything longer is not resolved
_INT = re.compile(r"^-?\d{1,18}$")
_ADDRESS = re.compile(r"^<[\w.]+ at (0x[0-9a-fA-F]+)>$")


@dataclass(frozen=True)
class LockRef:
    """One lock a frame names: `identity` is equal for two refs exactly when they are the same lock object (as far
    as the reader could tell); `expression` is how the source wrote it, for people."""

    identity: str
    expression: str

    def to_list(self) -> List[str]:
        return [self.identity, self.expression]

    @classmethod
    def from_list(cls, data) -> "LockRef":
        identity, expression = data
        return cls(str(identity), str(expression))


@dataclass(frozen=True)
class LockSites:
    """The lock expressions of one line of one function (from its file's AST)."""

    entering: Tuple[str, ...] = ()  # `with X:` whose header is this line (blocked entering it when innermost)
    acquiring: Tuple[str, ...] = ()  # `X.acquire(` on this line
    inside: Tuple[str, ...] = ()  # `with X:` blocks around this line, header above it
    acquired: Tuple[str, ...] = ()  # `X.acquire()` earlier in the function, no `X.release()` since
    local_names: FrozenSet[str] = frozenset()  # the function's parameters and assigned names
    module_level: bool = False
    # name -> (function name, first line) of the enclosing call whose local it is, for names that a nested
    # function shares with its enclosing one (a closure's cell): `mine` in `def f(): mine = Lock(); def g(): mine`
    cells: Tuple[Tuple[str, str, int], ...] = ()


def _is_lock_expression(node: ast.expr) -> bool:
    """A name, attribute or subscript chain: `with torch.no_grad():` (a call) makes a context manager on the spot,
    never a lock someone else holds."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return isinstance(node, ast.Name)


def _text(node: ast.expr) -> Optional[str]:
    try:
        text = ast.unparse(node)
    except (RecursionError, ValueError):
        return None
    return text if len(text) <= MAX_EXPRESSION else None


def _method_target(node: ast.AST, method: str) -> Optional[str]:
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method
            and _is_lock_expression(node.func.value)):
        return _text(node.func.value)
    return None


def _functions_around(tree: ast.AST, line: int) -> List[ast.AST]:
    """The functions whose body holds `line`, outermost first."""
    around = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
              and node.lineno <= line <= (node.end_lineno or node.lineno)]
    return sorted(around, key=lambda node: getattr(node, "lineno", 0))


def _local_names(function: ast.AST) -> FrozenSet[str]:
    names = set()
    arguments = getattr(function, "args", None)
    if isinstance(arguments, ast.arguments):
        for arg in arguments.posonlyargs + arguments.args + arguments.kwonlyargs:
            names.add(arg.arg)
        for extra in (arguments.vararg, arguments.kwarg):
            if extra is not None:
                names.add(extra.arg)
    for node in _own_scope(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not function:
            names.add(node.name)
    return frozenset(names)


def _own_scope(function: ast.AST) -> List[ast.AST]:
    """The nodes of a function's own scope: a nested function's or class's body belongs to another scope."""
    found: List[ast.AST] = []
    pending = list(ast.iter_child_nodes(function))
    while pending:
        node = pending.pop()
        found.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            pending.extend(ast.iter_child_nodes(node))
    return found


def sites_in(tree: ast.AST, line: int) -> LockSites:
    around = _functions_around(tree, line)
    function = around[-1] if around else None
    scope = function if function is not None else tree
    entering: List[str] = []
    inside: List[str] = []
    acquiring: List[Tuple[int, str]] = []
    acquires: List[Tuple[int, str]] = []
    releases: List[Tuple[int, str]] = []
    for node in ast.walk(scope):
        if isinstance(node, (ast.With, ast.AsyncWith)) and node.lineno <= line <= (node.end_lineno or node.lineno):
            in_header = line < node.body[0].lineno  # a header may span lines: `with (\n a,\n b):`
            for item in node.items:
                expression = item.context_expr
                text = _text(expression) if _is_lock_expression(expression) else None
                if text is None:
                    continue
                # On the header's first line (a one-line `with X: f()` too) the innermost frame is entering it and
                # an outer frame is inside it; the callers tell which (LockSites.entering).
                if line == node.lineno or (in_header and expression.lineno <= line <= (expression.end_lineno or line)):
                    entering.append(text)
                elif not in_header or (expression.end_lineno or line) < line:  # the body, or an item entered
                    inside.append(text)
        elif isinstance(node, ast.Call):
            acquired = _method_target(node, "acquire")
            if acquired is not None:
                (acquiring if node.lineno == line else acquires).append((node.lineno, acquired))
            released = _method_target(node, "release")
            if released is not None:
                releases.append((node.lineno, released))
    held = sorted({text for at, text in acquires if at < line
                   and not any(at < released_at <= line and released == text for released_at, released in releases)})
    # A closure's free variable is an enclosing call's local, one per call: as local as the function's own.
    local_names = frozenset().union(*(_local_names(node) for node in around))
    return LockSites(tuple(entering), tuple(text for _, text in sorted(acquiring)), tuple(inside), tuple(held),
                     local_names, function is None, _cells(around))


def _cells(around: List[ast.AST]) -> Tuple[Tuple[str, str, int], ...]:
    """The names the innermost function shares with a nested or enclosing function (closure cells), each with
    the function that owns it: (name, owner's name, owner's first line)."""
    found = []
    for depth, owner in enumerate(around):
        owned = _local_names(owner)
        inner = around[depth + 1:] or [node for node in ast.walk(owner)
                                       if node is not owner and isinstance(node, (ast.FunctionDef, ast.Lambda))]
        used_inside = {node.id for function in inner for node in ast.walk(function)
                       if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Store)}
        for name in sorted(owned & used_inside):
            found.append((name, getattr(owner, "name", "<lambda>"), getattr(owner, "lineno", 0)))
    innermost = _local_names(around[-1]) if around else frozenset()
    # an enclosing function's cell that the innermost one rebinds is the innermost's own local, not the cell
    return tuple(cell for cell in found if cell[2] == getattr(around[-1], "lineno", 0) or cell[0] not in innermost)


def cell_identity(filename: str, expression: str, sites: LockSites) -> Optional[Tuple[str, str]]:
    """From the source alone: a lock in a closure cell (a helper thread's target sharing its starter's local lock)
    as (identity, owning function's name). One identity per cell *definition*: the caller accepts it only when a
    single thread runs the owning function, so the cell is that call's."""
    chain = _chain(expression)
    if chain is None or any(isinstance(step, ast.Subscript) for step in chain[1]):
        return None
    # the innermost function owning the name: a nested scope's binding hides an outer one
    owner = next(((function, line) for name, function, line in reversed(sites.cells) if name == chain[0]), None)
    if owner is None:
        return None
    return f"cell {filename}:{owner[0]}@{owner[1]}:{expression}", owner[0]


SourceLines = Callable[[str], List[str]]  # a file's lines, [] when it may not or cannot be read


@functools.lru_cache(maxsize=256)
def _parse_text(source: str) -> Optional[ast.AST]:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # a 100,000-deep expression is not a crash
        return None


@functools.lru_cache(maxsize=256)
def _cached_tree(filename: str) -> Optional[ast.AST]:
    source = "".join(linecache.getlines(filename))
    return _parse_text(source) if source else None


@functools.lru_cache(maxsize=4096)
def _cached_sites(filename: str, line: int) -> LockSites:
    tree = _cached_tree(filename)
    return sites_in(tree, line) if tree is not None else LockSites()


def lock_sites(filename: str, line: int, lines: Optional[SourceLines] = None) -> LockSites:
    """The lock expressions at `line` of `filename`, read through `lines` (default: linecache, cached)."""
    if lines is None:
        return _cached_sites(filename, line)
    source = "".join(lines(filename))
    tree = _parse_text(source) if source else None
    return sites_in(tree, line) if tree is not None else LockSites()


# -- identities --------------------------------------------------------------------------------------------------
def _chain(expression: str) -> Optional[Tuple[str, List[ast.expr]]]:
    """`a.b[i].c` -> ('a', [Attribute b, Subscript [i], Attribute c]); None for anything else."""
    try:
        node = ast.parse(expression, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    steps: List[ast.expr] = []
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        steps.append(node)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return node.id, steps[::-1]


def global_identity(filename: str, expression: str, sites: LockSites) -> Optional[str]:
    """From the source alone: a chain rooted at a module global names one object in that file."""
    chain = _chain(expression)
    if chain is None or (not sites.module_level and chain[0] in sites.local_names):
        return None
    root, steps = chain
    if (root == "compile_lock" or expression.endswith(".compile_lock")) and "/torch/" in filename.replace("\\", "/"):
        return TORCH_COMPILE_LOCK  # one module global that other torch modules import by name
    if any(isinstance(step, ast.Subscript) and not isinstance(step.slice, ast.Constant) for step in steps):
        return None  # which item of a global list, only the frame's locals can say
    return f"global {filename}:{expression}"


def dump_identity(filename: str, expression: str, sites: LockSites, local_values: Dict[str, str]) -> Optional[str]:
    """From py-spy's --locals: the root local's address (its repr '<Type at 0x..>') plus the path, an index read
    from an int local; a root that is no local of the function is a module global (by file and name)."""
    chain = _chain(expression)
    if chain is None:
        return None
    root, steps = chain
    if root in local_values:
        address = _ADDRESS.match(local_values[root].strip())
        if address is None:
            return None
        base = address.group(1).lower()
    elif not sites.module_level and root in sites.local_names:
        return None  # a local py-spy did not print
    else:
        if global_identity(filename, expression, sites) == TORCH_COMPILE_LOCK:
            return TORCH_COMPILE_LOCK
        base = f"global {filename}:{root}"
    path = ""
    for step in steps:
        if isinstance(step, ast.Attribute):
            path += f".{step.attr}"
            continue
        assert isinstance(step, ast.Subscript)
        index = step.slice
        if isinstance(index, ast.Constant) and isinstance(index.value, (int, str)):
            path += f"[{index.value!r}]"
        else:
            value = _int_of(index, local_values)
            if value is None:
                return None
            path += f"[{value}]"
    return base + path


def _int_of(node: ast.expr, local_values: Dict[str, str]) -> Optional[int]:
    """An index as py-spy printed its locals: an int local, or + - % // of such and constants."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name) and _INT.match(local_values.get(node.id, "").strip()):
        return int(local_values[node.id])
    if isinstance(node, ast.BinOp) and type(node.op) in _INT_OPERATIONS:
        left, right = _int_of(node.left, local_values), _int_of(node.right, local_values)
        if left is None or right is None or abs(left) >= 2 ** 31 or abs(right) >= 2 ** 31:
            return None
        try:
            return _INT_OPERATIONS[type(node.op)](left, right)
        except ZeroDivisionError:
            return None
    return None


_INT_OPERATIONS: Dict[type, Callable[[int, int], int]] = {
    ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mod: int.__mod__, ast.FloorDiv: int.__floordiv__}


_MISSING = object()


def _static_attribute(value: object, name: str) -> object:
    """An attribute read without running user code: the instance's own dict, then a plain value or a slot on the
    class; a property or any other descriptor is not called."""
    if isinstance(value, type(ast)):  # a module: its dict is its globals
        return vars(value).get(name, _MISSING)
    try:  # object's own lookup: a class's __getattribute__ or __getattr__ is user code
        instance_dict = None if isinstance(value, type) else object.__getattribute__(value, "__dict__")
    except AttributeError:
        instance_dict = None
    if isinstance(instance_dict, dict) and name in instance_dict:
        return instance_dict[name]
    for klass in (value.__mro__ if isinstance(value, type) else type(value).__mro__):
        found = vars(klass).get(name, _MISSING)
        if found is _MISSING:
            continue
        if type(found).__name__ == "member_descriptor":  # __slots__: reading it runs no Python code
            try:
                return found.__get__(value, type(value))
            except AttributeError:
                return _MISSING
        return found if not hasattr(type(found), "__get__") else _MISSING
    return _MISSING


def _index(node: ast.expr, frame: FrameType) -> object:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, str)):
        return node.value
    if isinstance(node, ast.Name):
        value = frame.f_locals.get(node.id, _MISSING)
        return value if type(value) in (int, str) else _MISSING
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mod, ast.FloorDiv)):
        left, right = _index(node.left, frame), _index(node.right, frame)
        if type(left) is int and type(right) is int and abs(left) < 2 ** 31 and abs(right) < 2 ** 31:
            try:
                return _INT_OPERATIONS[type(node.op)](left, right)
            except ZeroDivisionError:
                return _MISSING
    return _MISSING


def live_object(expression: str, frame: FrameType) -> object:
    """The object `expression` names in a live frame of this process, or _MISSING."""
    chain = _chain(expression)
    if chain is None:
        return _MISSING
    root, steps = chain
    value = frame.f_locals.get(root, _MISSING)
    if value is _MISSING:
        value = frame.f_globals.get(root, _MISSING)
    for step in steps:
        if value is _MISSING:
            return _MISSING
        if isinstance(step, ast.Attribute):
            value = _static_attribute(value, step.attr)
            continue
        assert isinstance(step, ast.Subscript)
        index = _index(step.slice, frame)
        if index is _MISSING or type(value) not in (list, tuple, dict):
            return _MISSING
        try:
            value = value[index]
        except (LookupError, TypeError):
            return _MISSING
    return value


def is_lock(value: object) -> bool:
    kind = type(value)
    return hasattr(kind, "acquire") and hasattr(kind, "release") and not isinstance(value, type)


_PLAIN_LOCK = None
_OWNER = re.compile(r"owner=(\d+)")


def held_by(value: object, ident: int) -> Optional[bool]:
    """Whether the lock says thread `ident` holds it: a plain Lock only says whether anyone does, an RLock names
    its owner. None: the lock cannot say."""
    import threading

    global _PLAIN_LOCK
    if _PLAIN_LOCK is None:
        _PLAIN_LOCK = type(threading.Lock())
    if type(value) is _PLAIN_LOCK:
        return bool(value.locked())
    if type(value).__name__ == "RLock" and type(value).__module__ == "_thread":
        owner = _OWNER.search(repr(value))
        return owner is not None and int(owner.group(1)) == ident
    return None


def live_identity(expression: str, frame: FrameType) -> Optional[Tuple[str, object]]:
    value = live_object(expression, frame)
    if value is _MISSING or not is_lock(value):
        return None
    torch_name = global_identity(frame.f_code.co_filename, expression, LockSites(module_level=True))
    if torch_name == TORCH_COMPILE_LOCK:  # the same words a dump gives it, so the DFD902 tiebreak reads both
        return torch_name, value
    return f"object 0x{id(value):x}", value
