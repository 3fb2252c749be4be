"""How often `dflash-doctor logs` is fully right on real failure logs from public issue threads.

    python benchmarks/logs_heldout/evaluate.py            # table on stdout
    python benchmarks/logs_heldout/evaluate.py --write    # ... and rewrite benchmarks/logs_heldout/results.md

manifest.json lists each log's source (a GitHub issue or pull request), what kind of failure it shows and the
findings a careful reader expects, judged by hand before the tool ran on it. The logs came in batches (A to T):
each was labelled, run once with the code as it stood (manifest 'first_runs', with what each first run missed:
the held-out figures), and only then studied, its generic gaps fixed, before the next batch was run. From N on,
two batches were gathered at once (N with O, P with Q, R with S; no thread is in two batches) and the second was
run only after the first one's fixes. Labels changed after a run are listed in 'label_changes'. The log texts are
not in git: put the text pasted in each thread in cache/<id>.log (cache/ is ignored). None of these logs is a test
fixture: the fixtures the tests tune on are stand-ins written for the repository (fixtures/logs/).

A log is right when every expected finding is there (its code; its worker, GPU or severity where the manifest
gives one) and every finding the tool reports is expected or allowed (an extra cause or death is a wrong answer).
"""
from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MANIFEST = HERE / "manifest.json"
CACHE = HERE / "cache"
RESULTS = HERE / "results.md"
RECENT = 6  # the last batches, summed: how the tool does now on logs it has not seen


def _matches(finding: dict, want: dict) -> bool:
    if finding["code"] != want["code"]:
        return False
    evidence = finding["evidence"]
    if want.get("worker") is not None and evidence.get("thread") != want["worker"]:
        return False
    if "gpu" in want and evidence.get("gpu") != want["gpu"]:
        return False
    return "severity" not in want or finding["severity"] == want["severity"]


def judge(entry: dict, findings: List[dict]) -> Tuple[str, List[str]]:
    """('right' | 'missed' | 'wrong' | 'missed+wrong', what went wrong). `alt`: findings accepted in place of the
    expected ones (another reading of the same log); when the alternative is what the tool found, the expected
    findings stay acceptable beside it (they are one reading of the same deaths, not extra ones)."""
    alternative = entry.get("alt", [])
    if alternative and all(any(_matches(f, want) for f in findings) for want in alternative):
        entry = dict(entry, expect=alternative, allow=entry["expect"] + entry.get("allow", []))
    missed = [want for want in entry["expect"] if not any(_matches(f, want) for f in findings)]
    accepted = entry["expect"] + entry.get("allow", [])
    extra = [f for f in findings if not any(_matches(f, {"code": a["code"], "worker": a.get("worker")})
                                            for a in accepted)]
    why = [f"missed {_label(w)}" for w in missed] + [
        f"extra {f['code']} ({f['evidence'].get('thread')}): {f['message'][:90]}" for f in extra]
    outcome = "right" if not why else "+".join(k for k, v in (("missed", missed), ("wrong", extra)) if v)
    return outcome, why


def _label(want: dict) -> str:
    return want["code"] + "".join(f" {k}={v}" for k, v in want.items() if k != "code" and v is not None)


def evaluate() -> Dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from dflash_doctor.logs.options import LogOptions
    from dflash_doctor.logs.source import scan_stream

    manifest = json.loads(MANIFEST.read_text())
    rows, missing = [], []
    for entry in manifest["logs"]:
        path = CACHE / f"{entry['id']}.log"
        if not path.is_file():
            missing.append(entry["batch"])
            continue
        report = scan_stream(io.BytesIO(path.read_bytes()), entry["id"], LogOptions())
        findings = [f.to_dict() for f in report.findings]
        outcome, why = judge(entry, findings)
        rows.append({"id": entry["id"], "url": entry["url"], "kind": entry["kind"], "batch": entry["batch"],
                     "outcome": outcome, "why": why, "found": sorted({f["code"] for f in findings})})
    batches: Dict[str, List[int]] = {}
    for row in rows:
        counts = batches.setdefault(row["batch"], [0, 0])
        counts[0] += row["outcome"] == "right"
        counts[1] += 1
    right = sum(1 for r in rows if r["outcome"] == "right")
    return {"rows": rows, "missing": missing, "right": right, "total": len(rows), "batches": batches,
            "first_runs": manifest.get("first_runs", []), "label_changes": manifest.get("label_changes", [])}


def markdown(result: Dict[str, Any], command: str) -> str:
    rows: List[dict] = result["rows"]
    total, right = result["total"], result["right"]
    share = 100.0 * right / total if total else 0.0
    per_batch = "; ".join(f"batch {name}: {right_b} of {total_b} ({100.0 * right_b / total_b:.1f} %)"
                          for name, (right_b, total_b) in sorted(result["batches"].items()))
    first: List[dict] = result["first_runs"]
    held_right, held_total = sum(r["right"] for r in first), sum(r["total"] for r in first)
    lines = [
        "# `logs` on held-out real logs",
        "",
        f"Command: `{command}`  ",
        f"Date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC.",
        "",
        "## Held out: each batch's first run",
        "",
        "Each batch was labelled by hand, then run once with the code as it stood. Those first runs are the "
        "held-out figures; after each, the misses were studied and the generic gaps fixed before the next batch "
        "was run (from N on, two batches were gathered at once and the second run after the first one's fixes).",
        "",
        "| batch | logs | right on its first run | code it ran |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r['batch']} | {r['total']} | {r['right']} ({100.0 * r['right'] / r['total']:.1f} %) | {r['code']} |"
              for r in first]
    if held_total:
        lines.append(f"| all | {held_total} | **{held_right} ({100.0 * held_right / held_total:.1f} %)** | |")
    if len(first) > RECENT:
        recent = first[-RECENT:]
        right_r, total_r = sum(r["right"] for r in recent), sum(r["total"] for r in recent)
        lines.append(f"| last {RECENT} ({recent[0]['batch']} to {recent[-1]['batch']}) | {total_r} | "
                     f"**{right_r} ({100.0 * right_r / total_r:.1f} %)** | |")
    lines += [
        "",
        "## Now (the same logs, after the fixes they prompted: not held out)",
        "",
        f"**{right} of {total} logs fully right ({share:.1f} %)**: {per_batch}."
        + (f" Not cached here (their texts were not kept), not counted: {_by_batch(result['missing'])}."
           if result["missing"] else ""),
        "",
        "Sources, kinds and the expected findings are in manifest.json; the judgement is evaluate.py's `judge`.",
        "",
        "| log | batch | kind | outcome | found | what went wrong |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        why = "; ".join(row["why"]).replace("|", "\\|")
        lines.append(f"| [{row['id']}]({row['url']}) | {row['batch']} | {row['kind']} | {row['outcome']} | "
                     f"{', '.join(row['found']) or '-'} | {why} |")
    lines += ["", "### What each first run missed", ""]
    for r in first:
        lines.append(f"- batch {r['batch']}: " + ("; ".join(r.get("misses", [])) or "none"))
    changes: List[dict] = result["label_changes"]
    lines += ["", "## Labels changed after a run", ""]
    lines += [f"- {', '.join(c['ids'])} ({c['batch']}): {c['change']}" for c in changes] or ["- none"]
    misses = [row for row in rows if row["outcome"] != "right"]
    lines += ["", "## Misses", ""]
    lines += [f"- {row['id']}: {'; '.join(row['why'])}" for row in misses] or ["- none"]
    return "\n".join(lines) + "\n"


def _by_batch(batches: List[str]) -> str:
    counts: Dict[str, int] = {}
    for batch in batches:
        counts[batch] = counts.get(batch, 0) + 1
    return ", ".join(f"{n} logs of batch {b}" for b, n in sorted(counts.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {RESULTS.relative_to(REPO)}")
    args = parser.parse_args()
    result = evaluate()
    text = markdown(result, "python benchmarks/logs_heldout/evaluate.py" + (" --write" if args.write else ""))
    sys.stdout.write(text)
    if args.write:
        RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
