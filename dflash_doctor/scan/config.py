"""`[tool.dflash-doctor]` in pyproject.toml: the scan's settings, found from the scanned paths upward like ruff.

    [tool.dflash-doctor]
    select = ["DFD1", "DFD201"]          # codes, prefixes or rule names (default: every scan rule)
    ignore = ["DFD202"]
    exclude = ["generated/*", "third_party"]   # globs, relative to the folder holding pyproject.toml
    fail-on = "error"                    # error | warning | info | never
    per-file-ignores = { "tests/*" = ["DFD102"], "bench/*.py" = ["DFD2"] }
    entry-points = ["train.py", "mypkg.cli:main"]   # the programs (files or modules) fixes are judged per

The nearest pyproject.toml above the scanned paths (their common folder) that has a `[tool.dflash-doctor]` table
is used; one without the table is passed over, as ruff does. Command-line options win over the file: --select and
--ignore replace its lists, --fail-on its threshold, and --exclude adds to its excludes. An unknown key, a value of
the wrong type or a TOML syntax error is a usage error (exit 2) naming the file.
"""
from __future__ import annotations

import fnmatch
import os
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from dflash_doctor.errors import UsageError
from dflash_doctor.findings import FailOn

SECTION = "dflash-doctor"
FILENAME = "pyproject.toml"
# key -> (python attribute, what it must be)
KEYS: Dict[str, Tuple[str, str]] = {
    "select": ("select", "a list of rule codes, prefixes or names"),
    "ignore": ("ignore", "a list of rule codes, prefixes or names"),
    "exclude": ("exclude", "a list of globs"),
    "fail-on": ("fail_on", "one of " + ", ".join(f.value for f in FailOn)),
    "per-file-ignores": ("per_file_ignores", "a table of glob = list of rule codes, prefixes or names"),
    "entry-points": ("entry_points", "a list of files (relative to pyproject.toml) or modules (pkg.cli or "
                                     "pkg.cli:main)"),
}


@dataclass(frozen=True)
class ScanConfig:
    path: Optional[str] = None  # the pyproject.toml it came from (None: no configuration)
    select: Optional[Tuple[str, ...]] = None
    ignore: Optional[Tuple[str, ...]] = None
    exclude: Tuple[str, ...] = ()
    fail_on: Optional[FailOn] = None
    per_file_ignores: Tuple[Tuple[str, Tuple[str, ...]], ...] = field(default=())
    entry_points: Tuple[str, ...] = ()  # empty: found from __main__ guards, console scripts, named files

    @property
    def root(self) -> str:
        """The folder relative globs are anchored at."""
        return os.path.dirname(os.path.abspath(self.path)) if self.path else os.getcwd()

    def to_dict(self) -> dict:
        return {"path": self.path, "select": list(self.select) if self.select is not None else None,
                "ignore": list(self.ignore) if self.ignore is not None else None, "exclude": list(self.exclude),
                "fail_on": self.fail_on.value if self.fail_on else None,
                "per_file_ignores": {glob: list(codes) for glob, codes in self.per_file_ignores},
                "entry_points": list(self.entry_points)}


def _load_toml(path: str) -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.9 and 3.10
        try:
            import tomli as tomllib
        except ImportError as exc:
            raise UsageError(f"{path}: reading it needs tomli on Python < 3.11 (pip install tomli)") from exc
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}") from exc


def _section(document: dict) -> Optional[dict]:
    tool = document.get("tool")
    return tool.get(SECTION) if isinstance(tool, dict) else None


def find(paths: Sequence[str]) -> Optional[str]:
    """The nearest pyproject.toml with a [tool.dflash-doctor] table above the scanned paths' common folder."""
    absolute = [os.path.abspath(p) for p in paths] or [os.getcwd()]
    try:
        folder = os.path.commonpath(absolute)
    except ValueError:  # paths on different Windows drives
        folder = absolute[0]
    if not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    while True:
        candidate = os.path.join(folder, FILENAME)
        if os.path.isfile(candidate) and _section(_load_toml(candidate)) is not None:
            return candidate
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def _strings(path: str, key: str, value) -> Tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise UsageError(f"{path}: [tool.{SECTION}] {key} must be {KEYS[key][1]}, not {value!r}")
    return tuple(value)


def load(path: str) -> ScanConfig:
    """Read and validate one pyproject.toml's [tool.dflash-doctor] table."""
    section = _section(_load_toml(path))
    if section is None:
        return ScanConfig(path=path)
    if not isinstance(section, dict):
        raise UsageError(f"{path}: [tool.{SECTION}] must be a table")
    unknown = sorted(set(section) - set(KEYS))
    if unknown:
        raise UsageError(f"{path}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} in "
                         f"[tool.{SECTION}]; known keys: {', '.join(KEYS)}")
    values: dict = {"path": path}
    for key in ("select", "ignore", "exclude", "entry-points"):
        if key in section:
            values[KEYS[key][0]] = _strings(path, key, section[key])
    if "entry-points" in section and not all(spec.strip() for spec in values["entry_points"] or [""]):
        raise UsageError(f"{path}: [tool.{SECTION}] entry-points must be {KEYS['entry-points'][1]}, "
                         f"not {section['entry-points']!r}")
    if "fail-on" in section:
        try:
            values["fail_on"] = FailOn(str(section["fail-on"]).lower())
        except ValueError:
            raise UsageError(f"{path}: [tool.{SECTION}] fail-on must be {KEYS['fail-on'][1]}, "
                             f"not {section['fail-on']!r}") from None
    if "per-file-ignores" in section:
        table = section["per-file-ignores"]
        if not isinstance(table, dict):
            raise UsageError(f"{path}: [tool.{SECTION}] per-file-ignores must be {KEYS['per-file-ignores'][1]}")
        values["per_file_ignores"] = tuple(
            (glob, _strings(path, "per-file-ignores", codes)) for glob, codes in table.items())
    return ScanConfig(**values)


def resolve(paths: Sequence[str], config_path: Optional[str] = None, isolated: bool = False) -> ScanConfig:
    """The configuration a scan of `paths` uses: `config_path` if given, else the nearest one, else none."""
    if isolated:
        return ScanConfig()
    if config_path is not None:
        if not os.path.isfile(config_path):
            raise UsageError(f"--config {config_path}: no such file")
        return load(config_path)
    found = find(paths)
    return load(found) if found else ScanConfig()


def relative_to(root: str, path: str) -> str:
    return os.path.relpath(os.path.abspath(path), root).replace(os.sep, "/")


def matches(glob: str, relative: str) -> bool:
    """A per-file-ignores or exclude glob against a root-relative posix path (a folder glob covers what is in it)."""
    glob = glob.rstrip("/")
    return fnmatch.fnmatch(relative, glob) or fnmatch.fnmatch(relative, glob + "/*") \
        or fnmatch.fnmatch(os.path.basename(relative), glob)


def ignored_codes(config: ScanConfig, path: str, expand) -> List[str]:
    """The codes per-file-ignores turns off for `path` (`expand` turns codes/prefixes/names into codes)."""
    if not config.per_file_ignores:
        return []
    relative = relative_to(config.root, path)
    codes: List[str] = []
    for glob, spec in config.per_file_ignores:
        if matches(glob, relative):
            codes.extend(expand(list(spec)))
    return codes
