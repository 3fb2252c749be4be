"""Module names to files: the dotted name of each scanned file (from the `__init__.py` files above it), and where a
module that project code imports lies on disk, within the project root."""
from __future__ import annotations

import os
from typing import Callable, Dict, Iterable, List, Optional, Tuple


def package_of(path: str, is_package_dir: Optional[Callable[[str], bool]] = None) -> Tuple[Optional[str], str]:
    """(package, module) dotted names of a file from the `__init__.py` files above it; (None, stem) for scripts."""
    is_package_dir = is_package_dir or (lambda d: os.path.isfile(os.path.join(d, "__init__.py")))
    folder, filename = os.path.split(os.path.abspath(path))
    return _names(folder_package(folder, is_package_dir), filename)


def folder_package(folder: str, is_package_dir: Callable[[str], bool]) -> Optional[str]:
    """The dotted package an absolute folder is, from the `__init__.py` files from it upwards; None if it is none."""
    parts: List[str] = []
    while folder and is_package_dir(folder):
        folder, name = os.path.split(folder)
        parts.insert(0, name)
        if not name:
            break
    return ".".join(parts) or None


def _names(package: Optional[str], filename: str) -> Tuple[Optional[str], str]:
    stem = os.path.splitext(filename)[0]
    if stem == "__init__":
        return package, package or stem
    return package, f"{package}.{stem}" if package else stem


class ModuleIndex:
    """Dotted module names of the scanned files, plus script-style imports of sibling files, plus (with `root`)
    the project's other files: a module a scanned file imports is looked up on disk under the folders Python
    would search for it (the importer's own top folder, the project root, its `src/`), never outside the root and
    never into an installed-package store below it (site-packages, a virtual environment)."""

    def __init__(self, paths: Iterable[str], root: Optional[str] = None):
        self.by_name: Dict[str, str] = {}
        self.by_abspath: Dict[str, str] = {}
        self.by_folder: Dict[str, List[str]] = {}  # absolute folder -> the scanned files in it
        self.root = os.path.abspath(root) if root else None
        self._package_dirs: Dict[str, bool] = {}
        self._on_disk: Dict[Tuple[str, str], Optional[str]] = {}
        self._inside_folders: Dict[str, bool] = {}
        self.packages: Dict[str, Optional[str]] = {}
        folders: Dict[str, Optional[str]] = {}  # absolute folder -> its package (a big tree has few folders)
        for path in paths:
            absolute = os.path.abspath(path)
            folder, filename = os.path.split(absolute)
            if folder not in folders:
                folders[folder] = folder_package(folder, self._is_package_dir)
            package, module = _names(folders[folder], filename)
            self.packages[path] = package
            self.by_name.setdefault(module, path)
            self.by_abspath[absolute] = path
            self.by_folder.setdefault(folder, []).append(path)

    def _is_package_dir(self, folder: str) -> bool:
        if folder not in self._package_dirs:
            self._package_dirs[folder] = os.path.isfile(os.path.join(folder, "__init__.py"))
        return self._package_dirs[folder]

    def package(self, path: str) -> Optional[str]:
        """The package of a scanned file, or of a project file found on disk."""
        if path not in self.packages:
            self.packages[path] = package_of(path, self._is_package_dir)[0]
        return self.packages[path]

    def find(self, dotted: str, importer: str) -> Optional[str]:
        if dotted in self.by_name:
            return self.by_name[dotted]
        base = os.path.join(os.path.dirname(os.path.abspath(importer)), *dotted.split("."))
        found = self.by_abspath.get(base + ".py") or self.by_abspath.get(os.path.join(base, "__init__.py"))
        if found is None and self.root is not None:
            found = self.find_on_disk(dotted, importer)
        return found

    def search_folders(self, importer: str) -> List[str]:
        """Where Python would look for an absolute import made by `importer`: the folder above its top package
        (the script's own folder for a script), the project root and `src/` under it."""
        folder = os.path.dirname(os.path.abspath(importer))
        package = self.package(importer)
        for _ in (package or "").split(".") if package else ():
            folder = os.path.dirname(folder)
        folders = [folder]
        if self.root is not None:
            folders += [self.root, os.path.join(self.root, "src")]
        return list(dict.fromkeys(folders))

    def find_on_disk(self, dotted: str, importer: str) -> Optional[str]:
        """The project file `dotted` names for `importer` (a module or a package's __init__.py), or None."""
        key = (dotted, os.path.dirname(os.path.abspath(importer)))
        if key not in self._on_disk:
            self._on_disk[key] = next((path for folder in self.search_folders(importer)
                                       if (path := self._module_file(folder, dotted)) is not None), None)
        return self._on_disk[key]

    def exists_on_disk(self, dotted: str, importer: str) -> bool:
        """Whether `dotted` is something in the project at all: a source, a package folder (namespace packages
        too), an extension module or a stub (those exist but hold nothing to follow)."""
        for folder in self.search_folders(importer):
            base = os.path.join(folder, *dotted.split("."))
            if not self.inside(base):
                continue
            if os.path.isdir(base) or os.path.isfile(base + ".py") or os.path.isfile(base + ".pyi"):
                return True
            parent, stem = os.path.split(base)
            try:
                if any(name.startswith(stem + ".") and name.endswith((".so", ".pyd"))
                       for name in os.listdir(parent or ".")):
                    return True
            except OSError:
                continue
        return False

    def inside(self, path: str) -> bool:
        """Below the project root, and not inside an installed-package store or environment on the way (decided
        once per folder: every lookup of a big tree's imports asks again)."""
        if self.root is None:
            return False
        folder = os.path.dirname(os.path.abspath(path))
        if folder not in self._inside_folders:
            self._inside_folders[folder] = self._folder_inside(folder)
        return self._inside_folders[folder]

    def _folder_inside(self, folder: str) -> bool:
        assert self.root is not None
        try:
            relative = os.path.relpath(folder, self.root)
        except ValueError:  # another Windows drive
            return False
        if relative == os.curdir:
            return True
        if relative == os.pardir or relative.startswith(os.pardir + os.sep) or os.path.isabs(relative):
            return False
        from dflash_doctor.scan.discovery import skip_reason

        parent, name = os.path.split(folder)
        return self.inside(folder) and not skip_reason(parent, name) if parent != folder else False

    def _module_file(self, folder: str, dotted: str) -> Optional[str]:
        base = os.path.join(folder, *dotted.split("."))
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if self.inside(candidate) and os.path.isfile(candidate):
                absolute = os.path.abspath(candidate)
                return self.by_abspath.get(absolute) or _spelled(absolute)
        return None


def _spelled(absolute: str) -> str:
    """A followed file as findings name it: relative to the working folder when below it, as scanned paths
    usually are."""
    relative = os.path.relpath(absolute)
    return absolute if relative.startswith(os.pardir) else relative
