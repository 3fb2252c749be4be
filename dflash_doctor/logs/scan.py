"""LogScanner: one pass over a log, line by line, producing DFD5xx findings as soon as they are certain.

`feed` returns the findings a line completes (so `--follow` can show them live), `finish` the Report. State is
bounded (see blocks.py and progress.py) and findings are capped per rule, so memory does not grow with the log.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional

from dflash_doctor.findings import Finding, Report
from dflash_doctor.logs import patterns
from dflash_doctor.logs.blocks import BlockParser, ExceptionBlock
from dflash_doctor.logs.progress import ProgressTracker
from dflash_doctor.rules.logs import (
    LOG_CUDA_OOM,
    LOG_DENSE_ATTENTION_FALLBACK,
    LOG_FX_TRACE_RACE,
    LOG_NCCL_TIMEOUT,
    LOG_RECOMPILE_LIMIT,
    LOG_THREAD_DIED,
    LOG_THREAD_STALLED,
    LOG_THROUGHPUT_DROP,
)

MAIN = "main"  # lines that name no thread
NOTHING: List[Finding] = []  # returned (never mutated) when a line completes no finding
BLOCK_GAP = 200  # lines after which an open block that stopped growing is closed (grep'd or interleaved logs)
RECOMPILE_LOOKAHEAD = 3  # the 'function:' line follows the recompile-limit line
MESSAGE_CHARS = 300
NAME_CACHE = 4096  # decoded thread names kept for the progress fast path
PROGRESS_ROWS = patterns.PROGRESS_ROWS.findall
TRIGGER = patterns.TRIGGER.search
UNIT_BYTES = patterns.UNIT_BYTES
# Dedup keys: one finding per thread for deaths, per (thread, GPU) for OOMs, per rank for NCCL, per function for
# recompile limits, per log for the dense fallback (torch warns once per process; a traceback through sdpa_dense
# after the warning is the same fact). Repeats are counted in facts["repeats"].


@dataclass(frozen=True)
class LogOptions:
    thread_pattern: Optional[str] = None  # regex; group 'thread' or group 1 names the thread
    baseline_window: int = 10
    sustain: int = 5
    drop: float = 0.3
    stall_steps: int = 20
    max_findings_per_code: int = 200


def compile_thread_pattern(pattern: Optional[str]) -> "re.Pattern":
    from dflash_doctor.errors import UsageError

    try:
        compiled = re.compile(pattern or patterns.DEFAULT_THREAD_PATTERN)
    except re.error as exc:
        raise UsageError(f"--thread-pattern {pattern!r}: {exc}") from exc
    if compiled.groups < 1:
        raise UsageError(f"--thread-pattern {pattern!r}: needs a group naming the thread, e.g. \\[(\\w+-\\d+)\\]")
    return compiled


class LogScanner:
    def __init__(self, path: str, options: LogOptions = LogOptions()) -> None:
        self.path = path
        self.options = options
        self._thread_re = compile_thread_pattern(options.thread_pattern)
        self._default_threads = options.thread_pattern is None
        self._blocks = BlockParser()
        self._block_line = 0
        self.progress = ProgressTracker(options.baseline_window, options.sustain, options.drop, options.stall_steps)
        self._findings: List[Finding] = []
        self._seen: Dict[tuple, int] = {}
        self._suppressed: Dict[str, int] = {}
        self._per_code: Dict[str, int] = {}
        self._deaths: Dict[str, dict] = {}
        self._pending_recompile: Optional[dict] = None
        self._names: Dict[bytes, str] = {}
        self.lines = 0
        self.bytes = 0
        self.exceptions = 0

    # -- input ---------------------------------------------------------------------------------------------

    def feed(self, raw: bytes, lineno: int) -> List[Finding]:
        """One line (without its newline): the findings it completes."""
        self.lines = lineno
        self.bytes += len(raw) + 1
        return self._feed_line(raw, lineno)

    def feed_block(self, block: bytes, lineno: int) -> List[Finding]:
        """Whole lines (reader.BlockSplitter's blocks), the first of them numbered `lineno`: the findings they
        complete. The same result as feeding each line, at a fraction of the cost: one findall parses every usual
        progress line of the block, and lines with no trigger word are skipped without leaving C."""
        self.bytes += len(block)
        new: List[Finding] = []
        feed_line = self._feed_line
        record = self.progress.record
        names = self._names
        idle = not (self._blocks.active or self._pending_recompile)
        # With --thread-pattern the progress fast path does not apply: every row goes the general way.
        rows = (PROGRESS_ROWS(block) if self._default_threads
                else [(line, b"", b"", b"", b"") for line in block.split(b"\n")[:-1]])
        for line, thread, step, value, unit in rows:
            if thread and idle:
                name = names.get(thread)
                if name is None:
                    name = thread.decode()
                    if len(names) < NAME_CACHE:
                        names[thread] = name
                drop = record(name, int(step), float(value) * UNIT_BYTES[unit], lineno)
                if drop is not None:
                    new += self._drop(drop)
            elif not idle or b"tok" in line or TRIGGER(line):
                self.lines = lineno
                new += feed_line(line, lineno)
                idle = not (self._blocks.active or self._pending_recompile)
            lineno += 1
        self.lines = lineno - 1
        return new

    def _feed_line(self, raw: bytes, lineno: int) -> List[Finding]:
        if not (self._blocks.active or self._pending_recompile):
            if b"tok" in raw:  # the common progress line: no block, nothing pending, no other rule to try
                start = raw.find(b"[")
                if self._default_threads and start >= 0 and raw.find(b"step", 0, start) < 0:
                    match = patterns.PROGRESS_LINE.match(raw, start)
                    if match:
                        thread, step, value, unit = match.group("thread", "step", "value", "unit")
                        drop = self.progress.record(thread.decode(), int(step),
                                                    float(value) * patterns.UNIT_BYTES[unit], lineno)
                        return NOTHING if drop is None else self._drop(drop)
                text = raw.decode("utf-8", "replace")
                rate = patterns.throughput(text)
                if rate is not None:
                    return self._progress(text, rate, lineno)
            elif not patterns.TRIGGER.search(raw):
                return NOTHING
        new: List[Finding] = []
        if self._blocks.active and lineno - self._block_line > BLOCK_GAP:
            new += self._close(self._blocks.flush())
        text = raw.decode("utf-8", "replace").rstrip("\r")
        closed, consumed = self._blocks.feed(text, lineno)
        if consumed:
            self._block_line = lineno
        new += self._close(closed)
        if not consumed:
            new += self._line(text, lineno)
        return new

    def idle(self) -> List[Finding]:
        """The follower caught up with the writer: emit what is complete now instead of at the next line."""
        new = self._close(self._blocks.flush(ended_only=True))
        return new + self._flush_recompile()

    def finish(self) -> Report:
        self._close(self._blocks.flush())
        self._flush_recompile()
        for stall in self.progress.stalls(exclude=self._deaths):
            self._emit(LOG_THREAD_STALLED, (stall.thread,),
                       f"thread {stall.thread} made no step progress after step {stall.last_step} while "
                       f"{stall.peer} advanced {stall.peer_advanced} steps",
                       stall.line, thread=stall.thread, last_step=stall.last_step, peer=stall.peer,
                       peer_advanced=stall.peer_advanced)
        report = Report(command="logs", findings=list(self._findings))
        report.facts = self.facts()
        return report

    # -- classification --------------------------------------------------------------------------------------

    def _thread_of(self, text: str) -> str:
        if self._default_threads:
            start = text.find("[")
            while start >= 0:
                match = patterns.BRACKET_THREAD_AT.match(text, start)
                if match:
                    return match.group("named") or match.group("rank")
                start = text.find("[", start + 1)
        match = self._thread_re.search(text)
        if not match:
            return MAIN
        named = match.groupdict()
        for key in ("thread", "rank", "named"):
            if named.get(key):
                return named[key]
        return next((g for g in match.groups() if g), MAIN)

    def _progress(self, text: str, rate: Optional[float], lineno: int) -> List[Finding]:
        drop = self.progress.record(self._thread_of(text), patterns.step(text), rate, lineno)
        return NOTHING if drop is None else self._drop(drop)

    def _drop(self, drop) -> List[Finding]:
        return self._emit(
            LOG_THROUGHPUT_DROP, (drop.thread, drop.from_line),
            f"{drop.thread}: throughput fell from {drop.baseline:,.0f} to {drop.level:,.0f} tok/s "
            f"({100 * (1 - drop.level / drop.baseline):.0f} % lower) from line {drop.from_line}",
            drop.from_line, thread=drop.thread, **{"from": drop.baseline, "to": drop.level},
            from_line=drop.from_line, sustained_at_line=drop.line)

    def _line(self, text: str, lineno: int) -> List[Finding]:
        new = self._flush_recompile(text) if self._pending_recompile is not None else []
        rate = patterns.throughput(text)
        if rate is not None or patterns.step(text) is not None:
            return new + self._progress(text, rate, lineno)
        thread = self._thread_of(text)
        if "FX to symbolically" in text and patterns.FX_TRACE_RACE.search(text):
            new += self._fx_race(thread, text.strip(), lineno, None)
        elif ("out of memory" in text or "OutOfMemory" in text) and patterns.CUDA_OOM.search(text):
            new += self._oom(thread, text.strip(), lineno, None)
        elif patterns.DENSE_FALLBACK_WARNING.search(text):
            new += self._emit(LOG_DENSE_ATTENTION_FALLBACK, (),
                              f"{thread}: flex_attention ran without torch.compile (dense path that materialises "
                              "the full scores matrix)", lineno, thread=thread, via="warning")
        elif "atchdog" in text:
            nccl = patterns.NCCL_TIMEOUT.search(text) or patterns.NCCL_STUCK.search(text)
            if nccl:
                new += self._nccl(thread, nccl, text, lineno)
        elif "hit config." in text:
            recompile = patterns.RECOMPILE_LIMIT.search(text)
            if recompile:
                self._pending_recompile = {"thread": thread, "line": lineno, "limit": recompile.group("limit"),
                                           "value": int(recompile.group("value")), "function": None}
        return new

    def _flush_recompile(self, text: Optional[str] = None) -> List[Finding]:
        pending = self._pending_recompile
        if pending is None:
            return []
        if text is not None:
            function = patterns.RECOMPILE_FUNCTION.search(text)
            if function:
                pending["function"] = f"{function.group('function')} ({function.group('where')})"
            elif self.lines - pending["line"] < RECOMPILE_LOOKAHEAD:
                return []
        self._pending_recompile = None
        where = f" for {pending['function']}" if pending["function"] else ""
        return self._emit(LOG_RECOMPILE_LIMIT, (pending["function"] or pending["thread"],),
                          f"Dynamo hit config.{pending['limit']} ({pending['value']}){where}: it now runs eagerly",
                          pending["line"], thread=pending["thread"], limit=pending["limit"],
                          limit_value=pending["value"], function=pending["function"])

    def _close(self, blocks: List[ExceptionBlock]) -> List[Finding]:
        new: List[Finding] = []
        for block in blocks:
            self.exceptions += 1
            new += self._block(block)
        return new

    def _block(self, block: ExceptionBlock) -> List[Finding]:
        thread = block.thread or MAIN
        final = block.final
        new: List[Finding] = []
        codes = []
        for exc in block.exceptions:
            text = f"{exc.type}: {exc.message}" if exc.message else exc.type
            if patterns.FX_TRACE_RACE.search(text):
                codes.append(LOG_FX_TRACE_RACE.code)
                new += self._fx_race(thread, text, exc.line, block)
            elif patterns.CUDA_OOM.search(text):
                codes.append(LOG_CUDA_OOM.code)
                new += self._oom(thread, text, exc.line, block)
            elif patterns.NCCL_EXCEPTION.search(text):
                codes.append(LOG_NCCL_TIMEOUT.code)
                new += self._emit(LOG_NCCL_TIMEOUT, (thread,), f"{thread}: {text[:MESSAGE_CHARS]}", exc.line,
                                  thread=thread, exception=exc.type, block_line=block.start_line)
        dense = [f for f in block.frames if f[2] in patterns.DENSE_FALLBACK_FRAMES]
        if dense:
            line = final.line if final else block.start_line
            new += self._emit(LOG_DENSE_ATTENTION_FALLBACK, (),
                              f"{thread}: traceback through {dense[-1][2]}, flex_attention's dense path", line,
                              thread=thread, via="traceback", frame=f"{dense[-1][0]}:{dense[-1][1]}",
                              block_line=block.start_line)
        if block.thread is None:
            return new
        if not codes:
            if final is None:
                message = f"thread {thread} died; its exception is not in the log"
            else:
                said = f": {final.message}" if final.message else ""
                message = f"thread {thread} died: {final.type}{said}"[:MESSAGE_CHARS]
            codes.append(LOG_THREAD_DIED.code)
            new += self._emit(LOG_THREAD_DIED, (thread,), message, final.line if final else block.start_line,
                              thread=thread, exception=final.type if final else None, block_line=block.start_line,
                              last_step=self._last_step(thread))
        if thread not in self._deaths and len(self._deaths) < self.progress.max_threads:
            self._deaths[thread] = {
                "line": final.line if final else block.start_line,
                "block_line": block.start_line,
                "exception": final.type if final else None,
                "message": (final.message if final else "")[:MESSAGE_CHARS],
                "code": codes[0],
                "last_frame": f"{block.frames[-1][0]}:{block.frames[-1][1]} in {block.frames[-1][2]}"
                if block.frames else None,
            }
        return new

    def _last_step(self, thread: str) -> Optional[int]:
        state = self.progress.threads.get(thread)
        return state.last_step if state else None

    def _fx_race(self, thread: str, text: str, line: int, block: Optional[ExceptionBlock]) -> List[Finding]:
        return self._emit(
            LOG_FX_TRACE_RACE, (thread,),
            f"{thread}: RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized "
            "function (the FX-tracing race between threads)", line,
            thread=thread, block_line=block.start_line if block else None, last_step=self._last_step(thread),
            **_gpu(text))

    def _oom(self, thread: str, text: str, line: int, block: Optional[ExceptionBlock]) -> List[Finding]:
        gpu = patterns.OOM_GPU.search(text)
        index = None if gpu is None else int(gpu.group("gpu") or gpu.group("old"))
        tried = patterns.OOM_TRIED.search(text)
        where = f" on GPU {index}" if index is not None else ""
        return self._emit(
            LOG_CUDA_OOM, (thread, index), f"{thread}: CUDA out of memory{where}"
            + (f" (tried to allocate {tried.group('size')})" if tried else ""), line,
            thread=thread, gpu=index, tried_to_allocate=tried.group("size") if tried else None,
            block_line=block.start_line if block else None, last_step=self._last_step(thread))

    def _nccl(self, thread: str, match: "re.Match", text: str, line: int) -> List[Finding]:
        groups = match.groupdict()
        rank_match = None if groups.get("rank") else patterns.NCCL_RANK.search(text)
        rank_text = groups.get("rank") or (rank_match.group("rank") if rank_match else None)
        rank = int(rank_text) if rank_text else None
        if groups.get("ran"):
            timeout = re.search(r"Timeout\(ms\)=(\d+)", groups["work"] or "")
            message = (f"rank {rank if rank is not None else '?'}: NCCL collective timed out after "
                       f"{int(groups['ran']) / 1000:.0f} s ({groups['work']})")
            extra = {"work": groups["work"], "ran_ms": int(groups["ran"]),
                     "timeout_ms": int(timeout.group(1)) if timeout else None}
        else:
            message = f"rank {rank if rank is not None else '?'}: NCCL watchdog stuck for {groups['secs']} s"
            extra = {"stuck_s": int(groups["secs"])}
        return self._emit(LOG_NCCL_TIMEOUT, (rank if rank is not None else thread,), message, line,
                          thread=thread, rank=rank, **extra)

    def _emit(self, rule, key: tuple, message: str, line: int, **evidence) -> List[Finding]:
        full_key = (rule.code,) + key
        if full_key in self._seen:
            self._seen[full_key] += 1
            return []
        if self._per_code.get(rule.code, 0) >= self.options.max_findings_per_code:
            self._suppressed[rule.code] = self._suppressed.get(rule.code, 0) + 1
            return []
        self._seen[full_key] = 1
        self._per_code[rule.code] = self._per_code.get(rule.code, 0) + 1
        finding = rule.finding(message, path=self.path, line=line, column=1, evidence=evidence)
        self._findings.append(finding)
        return [finding]

    # -- facts -----------------------------------------------------------------------------------------------

    def facts(self) -> dict:
        threads = {}
        for name, state in self.progress.threads.items():
            threads[name] = {
                "last_step": state.last_step,
                "last_step_line": state.last_step_line,
                "last_tok_s": state.last_tok_s,
                "progress_lines": state.progress_lines,
                "died": self._deaths.get(name),
            }
        for name, death in self._deaths.items():
            threads.setdefault(name, {"last_step": None, "last_step_line": None, "last_tok_s": None,
                                      "progress_lines": 0, "died": death})
        repeats = {}
        for key, count in self._seen.items():
            if count > 1:
                repeats[key[0]] = repeats.get(key[0], 0) + count - 1
        return {
            "path": self.path,
            "lines": self.lines,
            "bytes": self.bytes,
            "exceptions": self.exceptions,
            "threads": dict(sorted(threads.items())),
            "untracked_threads": self.progress.untracked_threads,
            "repeats": repeats,
            "suppressed": self._suppressed,
        }


def _gpu(text: str) -> dict:
    match = patterns.GPU_MENTION.search(text)
    return {"gpu": int(match.group("gpu"))} if match else {}


def scan_stream(stream, path: str, options: LogOptions = LogOptions()) -> Report:
    """Scan a binary stream to its end."""
    from dflash_doctor.logs.reader import iter_blocks

    scanner = LogScanner(path, options)
    feed_block = scanner.feed_block
    for block in iter_blocks(stream):
        feed_block(block, scanner.lines + 1)
    return scanner.finish()


def follow_file(path: str, options: LogOptions, should_stop, on_findings=None, sleep=None, poll: float = 0.25
                ) -> Report:
    """`tail -f` a file from its start until `should_stop()` or Ctrl-C; `on_findings` gets new findings live."""
    from dflash_doctor.logs.reader import follow_blocks

    scanner = LogScanner(path, options)

    def idle() -> None:
        found = scanner.idle()
        if found and on_findings is not None:
            on_findings(found)

    lineno = 1
    try:
        for block in follow_blocks(path, should_stop, on_idle=idle, sleep=sleep, poll=poll):
            if block is None:  # truncated: line numbers restart with the new content
                lineno = 1
                continue
            found = scanner.feed_block(block, lineno)
            lineno = scanner.lines + 1
            if found and on_findings is not None:
                on_findings(found)
    except KeyboardInterrupt:
        pass  # Ctrl-C ends following; the report of what was read still comes out
    return scanner.finish()
