"""DFD503: a sustained throughput drop against the rolling baseline, per worker or their total (read by
logs/worker_progress.py; the rule declares no pattern)."""
from __future__ import annotations

from dflash_doctor.findings import Severity
from dflash_doctor.rules.logs.model import declare
from dflash_doctor.rules.registry import Rule


LOG_THROUGHPUT_DROP = declare(Rule(
    code="DFD503",
    name="log-throughput-drop",
    severity=Severity.WARNING,
    summary="sustained throughput drop against the rolling baseline (per worker, or their total)",
    rationale=(
        "Throughput is read in the forms trainers print: '7.1 Ktok/s', 'tokens/s=9800', torchtitan's 'tps: "
        "5,856', 'samples/s', tqdm's 'it/s' and 's/it', Megatron's 'elapsed time per iteration (ms)'; only the "
        "number that belongs to the unit, never a neighbouring loss. Each worker's series has a baseline (median "
        "of the last --baseline-window samples); a drop fires when --sustain consecutive samples are all more "
        "than --drop below it, so one noisy line never fires. The sum over workers is watched too (when the log "
        "prints no total of its own): a dead worker takes its share with it while the survivors look healthy. A "
        "short log that ends on a lower level (two or more samples after at least three before) is a drop too."
    ),
    fix="Look at what happened just before the 'from_line' of the evidence: a dead thread, a recompile, an OOM.",
    example_format="log",
    bad=(
        "step=1 21.4 Ktok/s\nstep=2 21.6 Ktok/s\nstep=3 21.5 Ktok/s\nstep=4 21.3 Ktok/s\nstep=5 21.7 Ktok/s\n"
        "step=6 21.5 Ktok/s\nstep=7 21.4 Ktok/s\nstep=8 21.6 Ktok/s\nstep=9 21.5 Ktok/s\nstep=10 21.5 Ktok/s\n"
        "step=11 14.2 Ktok/s\nstep=12 14.1 Ktok/s\nstep=13 14.3 Ktok/s\nstep=14 14.0 Ktok/s\nstep=15 14.2 Ktok/s\n"
    ),
    good=(
        "step=1 21.4 Ktok/s\nstep=2 21.6 Ktok/s\nstep=3 21.5 Ktok/s\nstep=4 21.3 Ktok/s\nstep=5 21.7 Ktok/s\n"
        "step=6 21.5 Ktok/s\nstep=7 21.4 Ktok/s\nstep=8 21.6 Ktok/s\nstep=9 21.5 Ktok/s\nstep=10 21.5 Ktok/s\n"
        "step=11 9.1 Ktok/s\nstep=12 21.1 Ktok/s\nstep=13 21.3 Ktok/s\nstep=14 21.0 Ktok/s\nstep=15 21.2 Ktok/s\n"
    ),
), next_steps=lambda found, threads, count: [
    f"read the log just before line {found[0].evidence.get('from_line', found[0].line)}: a worker that died, a "
    "recompile or a fallback explains most drops"])
