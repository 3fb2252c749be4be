"""One line per case run by run_cases.py: the plain loop's outcome, or the tool's verdict, from their own JSON.

    python benchmarks/gpu/summarize_cases.py OUT_DIR
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

BACKWARD_COMPILE = ("compile_fx_backward", "bw_compiler")


def loop_line(doc: dict) -> str:
    threads = doc.get("threads") or []
    parts = [f"{doc.get('outcome')} in {doc.get('seconds')} s"]
    errors = [t for t in threads if t.get("outcome") == "error"]
    if errors:
        parts.append(f"{len(errors)} thread(s) raised{' the FX error' if any(t.get('fx_error') for t in errors) else ''}"
                     f": {errors[0].get('error', '')[:100]}")
    stacks = doc.get("stacks") or {}
    if stacks:
        waiting_bw = [n for n, frames in stacks.items() if any(f.split(':')[-1] in BACKWARD_COMPILE for f in frames)]
        compiling = [n for n, frames in stacks.items() if any(f.endswith(":_compile") for f in frames)]
        parts.append(f"stacks: backward-compile in {waiting_bw or 'none'}, Dynamo _compile in {compiling or 'none'}")
    firsts = [e for e in doc.get("events") or [] if e.get("what") in ("first-call", "first-return",
                                                                        "first-backward-done", "compile-start",
                                                                        "compile-end")]
    parts.append("timeline: " + ", ".join(f"{e['t']}s {e['thread']} {e['what']}"
                                          f"{'(' + e['trigger'].split('.')[-1] + ')' if e.get('trigger') else ''}"
                                          for e in firsts[:24]))
    return "; ".join(parts)


def tool_line(doc: dict) -> str:
    facts = doc.get("facts") or {}
    multi = facts.get("multi_thread") or {}
    line = (f"verdict {facts.get('verdict')} kind {facts.get('kind')} level {facts.get('level')} "
            f"ttv {facts.get('time_to_verdict_s')} s; multi {multi.get('outcome')} "
            f"{[(t['name'], t['outcome'], t.get('steps')) for t in multi.get('threads', [])]}")
    hang = facts.get("hang") or multi.get("hang") or {}
    if hang:
        line += f"; hang {hang.get('cycle')}"
    events = [e for e in multi.get("events") or [] if e.get("kind") in ("compile", "step")][:30]
    line += "; events: " + ", ".join(f"{e['t']:.2f}s {e['thread']} {e['kind']}{e['phase']}"
                                     f"{'(' + str(e['detail'].get('trigger', '')) + ')' if e['kind'] == 'compile' else ''}"
                                     for e in events)
    if doc.get("problems"):
        line += "; problems: " + "; ".join(p.get("reason", "")[:120] for p in doc["problems"])
    return line


def main(argv=None) -> int:
    out_dir = Path((sys.argv[1:] if argv is None else argv)[0])
    cases = json.loads((out_dir / "cases.json").read_text(encoding="utf-8"))
    for case in cases:
        path = out_dir / f"{case['name']}.json"
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            tail = (out_dir / f"{case['name']}.log").read_text(encoding="utf-8", errors="replace")[-300:]
            print(f"{case['name']}: rc={case['rc']} wall={case['wall_s']}s no JSON ({type(exc).__name__}); log: {tail!r}")
            continue
        body = tool_line(doc) if "facts" in doc else loop_line(doc)
        print(f"{case['name']}: rc={case['rc']} wall={case['wall_s']}s {body}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
