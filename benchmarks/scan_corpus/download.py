"""Bring the scan corpus (corpus.json) onto this machine, never into git: PyPI releases with
`pip download --no-deps` (wheel or sdist, unpacked), GitHub repositories at their recorded commit.

    python benchmarks/scan_corpus/download.py [--into DIR] [--git-mirror DIR] [--only NAME ...]

`--git-mirror DIR` reads repositories from bare clones laid out as DIR/<owner>+<name>/repo (no network); without
it each repository is cloned and checked out at its commit. Each entry lands in DIR/<name>/ (default: src/ next to
this file, which .gitignore keeps out of the repository); an entry already there is left alone. Of a repository only
its .py files are taken (what the scan reads). An entry with `paths` (folders or files inside the unpacked release or
the repository) keeps only those, at the same place, to keep a large code base to the part that trains.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def entries(only=()) -> list:
    chosen = json.loads((HERE / "corpus.json").read_text())["entries"]
    return [e for e in chosen if not only or e["name"] in only]


def _unpack(archive: Path, into: Path) -> None:
    if archive.suffix == ".whl" or archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(into)
    else:
        with tarfile.open(archive) as tarred:
            tarred.extractall(into, filter="data") if sys.version_info >= (3, 12) else tarred.extractall(into)


def fetch_pypi(entry: dict, into: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", entry["spec"], "-d", tmp],
                       check=True)
        [archive] = list(Path(tmp).iterdir())
        _unpack(archive, into)


def fetch_git(entry: dict, into: Path, mirror: Path = None) -> None:
    owner, name = entry["repo"].split("/")
    with tempfile.TemporaryDirectory() as tmp:
        if mirror is not None:
            git_dir = mirror / f"{owner}+{name}" / "repo"
        else:
            git_dir = Path(tmp) / "clone.git"
            subprocess.run(["git", "clone", "--bare", "--quiet", f"https://github.com/{entry['repo']}", str(git_dir)],
                           check=True)
        archive = Path(tmp) / "tree.tar"
        # Python sources only: the scan reads nothing else, and mirrors may lack large binary blobs.
        subprocess.run(["git", f"--git-dir={git_dir}", "archive", "--format=tar", "-o", str(archive),
                        entry["commit"], "--", "*.py"], check=True)
        into.mkdir(parents=True)
        _unpack(archive, into)


def _keep_only(entry: dict, tree: Path) -> None:
    kept = entry.get("paths")
    if not kept:
        return
    whole = tree.with_name(tree.name + ".whole")
    tree.rename(whole)
    for rel in kept:
        source, target = whole / rel, tree / rel
        if not source.exists():
            raise SystemExit(f"{entry['name']}: {rel} is not in the downloaded tree")
        target.parent.mkdir(parents=True, exist_ok=True)
        source.rename(target)
    shutil.rmtree(whole)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--into", type=Path, default=HERE / "src")
    parser.add_argument("--git-mirror", type=Path, default=None)
    parser.add_argument("--only", nargs="*", default=())
    args = parser.parse_args(argv)
    for entry in entries(args.only):
        target = args.into / entry["name"]
        if target.exists():
            continue
        partial = args.into / (entry["name"] + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        if entry["kind"] == "pypi":
            fetch_pypi(entry, partial)
        else:
            fetch_git(entry, partial, args.git_mirror)
        _keep_only(entry, partial)
        partial.rename(target)
        sys.stderr.write(f"{entry['name']}: {sum(1 for _ in target.rglob('*.py'))} .py files\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
