"""The shapes of a log that no single rule owns: traceback structure, worker prefixes, thread names.

What each fatal kind's text looks like lives with its rule (the package dflash_doctor/rules/logs/). Sources for these:
Lib/threading.py and Modules/_threadmodule.c (excepthook: 'Exception in thread NAME:', written in pieces, so two
threads dying together print 'Exception in thread Exception in thread A:' and later a bare 'B:'),
Lib/traceback.py, torchrun's per-rank line prefix ('[rank1]:', older '[default1]:'), Ray's '(Worker pid=N)', vLLM's
'(VllmWorker rank=2 pid=N)', pdsh's '10.0.0.7: '.
"""
from __future__ import annotations

import re

# 'Exception in thread A:'; 'Exception in thread Exception in thread A:' when a second thread's header was cut
# by this one (its name comes later, alone on a line: 'B:').
# A header whose first word was cut off in the paste ('in thread Thread-3:') still opens the thread's block.
THREAD_EXCEPTION = re.compile(r"^(?P<repeat>(?:Exception in thread )++|in thread )(?P<thread>.+?)\s*:\s*$")
THREAD_HEADER_STARTS = ("Exception in thread ", "in thread ")
# multiprocessing.Process prints 'Process NAME:' before the traceback of a child that raised.
PROCESS_HEADER = re.compile(r"^Process (?P<name>[A-Za-z_][\w.-]*):\s*$")
BARE_THREAD_NAME = re.compile(r"^(?P<thread>[^\s:]{1,200}):\s*$")
# A progress bar redrawn with '\r' can leave its tail on the header line ('...call last):   | 4/84 [00:52<17:32]').
# A header split by a redrawn bar ('...it/s]Traceback (most recent cal' / 'l last):') still opens its block.
# (not PaddlePaddle's 'C++ Traceback (most recent call last):', whose frames are native; rich draws its own in a
# box: '╭─── Traceback (most recent call last) ───╮')
TRACEBACK_START = re.compile(r"(?<!C\+\+ )Traceback \(most recent call last\):(?:\s*$|\s+.*\|\s*\d+/\d+\b.*$)"
                             r"|[\u256d\u250c]\u2500+ Traceback \(most recent call last\) \u2500"
                             r"|Traceback \(most r[a-z ]*$"
                             # a traceback whose line breaks were lost in a paste: 'Traceback (...): File "x.py", ...'
                             # (each lost line may keep its logger prefix: '...last):(VllmWorker rank=0 pid=9) ...')
                             r"|Traceback \(most recent call last\):(?=.{0,200}\bFile \")")
# IPython 8's frame: 'File ~/lib/python3.8/site-packages/pl/launchers/multiprocessing.py:113, in launch(self, ...)'
IPYTHON_FRAME = re.compile(r"^File (?P<file>(?:~|/|[A-Za-z]:\\)[^,]*?):(?P<line>\d+), in (?P<func>[\w.<>]+)")
# rich's pointer at a frame's current line ('│ ❱ 1024 │   raise RuntimeError(...'): a boxed traceback pasted from
# its middle, without the box's header.
RICH_POINTER = re.compile(r"^\u2502 \u2771 *\d+ \u2502")
# IPython / Jupyter print the exception's type first, on the header line, then cells and frames without quotes
# ('CacheLimitExceeded      Traceback (most recent call last)'); the type stands in when the paste is cut.
IPYTHON_TRACEBACK = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)\s{2,}Traceback \(most recent call last\)\s*$")
# An RFC 3339 timestamp before every line (docker logs --timestamps, Kubernetes, Beaker):
# '2024-05-26T03:20:45.253031734Z   File "x.py", line 3, in f'.
# Also a job runner's date before the line ('2023/10/26 12:12:06 NCCL INFO ...').
ISO_STAMP = re.compile(r"^\d{4}([-/])\d\d\1\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?:? ")
# Markdown around a pasted log: quote markers ('> ', '> > '), a code fence or an inline-code backtick glued to the
# first line, bold ('**RuntimeError: ...**').
MARKDOWN_LEAD = re.compile(r"^(?:> ?)+|^`+[\x22']?(?=\S)|^\*\*(?=\S)")  # (inline code may quote the line too)
# A progress bar redrawn with '\r' and a thread's header printed after it: '  0%|   | 0/117 [00:00<?, ?it/s]'.
PROGRESS_BAR_TAIL = re.compile(r"(?:\||\]|it/s|s/it)\s*$")
CHAIN = re.compile(r"^\s*(During handling of the above exception|The above exception was the direct cause)")
FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<func>\S+)')
# The same frame pasted without its indentation (some consoles and issue pastes strip it); only read inside a
# traceback that is still open, and the function name may have been cut.
UNINDENTED_FRAME = re.compile(r'^File "(?P<file>[^"]*)", line (?P<line>\d+), in ?(?P<func>\S*)')
# The last line of a traceback: a (possibly module-qualified) exception type, optionally ': message'.
# Classes defined in functions print as module.func.<locals>.Name.
EXCEPTION_LINE = re.compile(
    r"^(?P<type>(?:(?:[A-Za-z_]\w*|<locals>)\.)+[A-Za-z_]\w*|Exception|[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|"
    r"Iteration|Warning|Failure|Failed|Timeout|Empty|Hit|OutOfResources))(?::\s?(?P<message>.*))?$"
)
# Lines that end a multi-line exception message: another log record, a prefix, a progress line.
RECORD_START = re.compile(r"^(?:\[|\d|[IWEF]\d{4} |(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\b|terminate called )"
                          r"|\b(?:[Ss]tep|STEP|iteration)\b\s*[=:]?\s*\d|\d\s?[kKmM]?(?:tok|tokens|samples|it)/s\b"
                          r"|\b(?:tps|wps):"
                          r"|\bDFD\d{3} [a-z]+-[a-z]")  # (dflash-doctor's own finding lines, `run` saved with its output)

# A per-worker prefix on every line: torchrun's '[rank1]:' / '[default1]:', Ray's '(Name pid=123)'.
# vLLM adds a role between name and pid ('(VllmWorker rank=2 pid=267)', '(VllmWorker TP1 pid=9)') and nests them
# ('(EngineCore_0 pid=8) (VllmWorker TP1 pid=9) '): the innermost names the worker.
_PROC = r"\((?P<proc>[A-Za-z_][\w.]*)(?P<role>(?: [A-Za-z]+=?\w+)*) pid=(?P<pid>\d+)(?:, ip=[^)]*)?\) ?"
WORKER_PREFIX = re.compile(
    # the '[' is lost when a redrawn progress bar overwrote it; torchx / NeMo-run print the local rank then the
    # global one ('[default1]:[rank9]:'), and the global one names the worker
    r"^(?:\[default\d+\]:(?=\[rank))?\[?(?:rank|default)(?P<rank>\d+)\]: ?(?:\[rank(?P=rank)\]: ?)?"  # (or twice)
    # Open MPI's --tag-output ('[1,7]<stderr>:', job and rank), after --timestamp-output's date if any
    r"|^(?:\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})?\[\d+,(?P<mpirank>\d+)\]<std(?:err|out)>: ?"
    # pdsh (DeepSpeed's multi-node launcher) puts the node's address before each line: '10.223.4.143: Traceback'
    r"|^(?P<host>\d{1,3}(?:\.\d{1,3}){3}): "
    # docker compose puts the service's container before each line: 'sglang-1  | Traceback ...'
    r"|^(?P<container>[A-Za-z0-9][\w.-]*-\d+) +\| "
    # a node's name before a rank's prefix (pdsh: 'worker-5: [rank22]: ...'), a runner's stream tag
    # (milabench: 'bench.node.nolog [stderr] '): the line's worker comes from what follows
    # (torchx / NeMo-run: 'B-nemo-ft3/0 [default1]:[rank1]: ...', a role and its replica)
    r"|^(?P<node>[A-Za-z0-9][\w./-]*)(?::? (?=\[(?:rank|default)\d+\]:)| \[std(?:err|out)\] )"
    r"|^(?P<node_>std(?:err|out)): "  # accelerate's test runner: 'stderr: Traceback ...'
    r"|^(?:\([A-Za-z_][\w.]*(?: [A-Za-z]+=?\w+)* pid=\d+(?:, ip=[^)]*)?\) ?)*" + _PROC
    # older Ray: '(pid=24123) Exception in thread Thread-1:'
    + r"|^\(pid=(?P<barepid>\d+)(?:, ip=[^)]*)?\) ?"
)

# vLLM's logger writes every line of a traceback behind its record prefix ('ERROR 05-04 12:23:00
# [multiproc_executor.py:380]   File ...'; older releases without the brackets), sometimes behind a container
# runtime's timestamp ('- 2024-06-22T20:16:34.700+00:00 '): taken off so the traceback reads as one.
LOGGER_RECORD_PREFIX = re.compile(
    r"^(?:- )?(?:\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:?\d\d)? )?(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) "
    r"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w.-]+\.py:\d+\] ")

# glog's info record ('I0228 14:05:56.114109 1619334 ProcessGroupNCCL.cpp:484] ...', '[I228 ...' behind a rank).
GLOG_INFO = re.compile(r"^\[?I\d{3,4} \d\d:\d\d:\d\d")

# Which thread a line belongs to: thread=NAME / worker=NAME, [NAME-N], NAME-N, [rankN]. Leftmost match wins.
DEFAULT_THREAD_PATTERN = (
    r"\b(?:thread|worker)[=:]\s*(?P<thread>[\w.-]+)"
    # a logged excepthook's one line ('... Exception in thread fx-tracer: AssertionError: ...'): any thread name
    r"|\bException in thread (?P<excepthook>[\w.-]+):"
    r"|\[(?P<rank>rank\d+)\]"
    # ('gpu-worker-1' whole; not a folder of a path, '/lf-071/'; possessive and bounded: linear on any line)
    r"|(?<![/\\])\b(?P<named>[A-Za-z][A-Za-z_]*+(?:-[A-Za-z_]++){0,3}-\d+)\b(?![/\\])"
)
# A trainer's own tag for a worker at the start of its lines, '[gpu0] epoch 0 step 10', when nothing else names one
# (the line's worker; a traceback's lines behind such a tag: logs/logged.py).
LINE_TAG = re.compile(r"\[(?P<tag>[A-Za-z]{2,20}\d{1,4})\] ")
# The same default, fast path: the common '[drafter-0]' / '[rank3]' prefix, tried at each '['.
BRACKET_THREAD_AT = re.compile(r"\[(?:(?P<rank>rank\d+)|(?P<named>[A-Za-z][A-Za-z_]*+(?:-[A-Za-z_]++){0,3}-\d+))\]")

# Progress, fast path: the usual '[drafter-0] ... step=12 ... 7.1 Ktok/s' line, tested over a whole run of lines
# in one findall: one (line, thread, step, value, unit) row per line, the last four empty unless the line is such
# a progress line whose first '[' is the thread's and has no 'step' before it. Every other line goes the general
# way (dflash_doctor.logs.throughput), which reads the same numbers from these lines.
PROGRESS_ROWS = re.compile(
    rb"((?:[^\[\ns]*(?:s(?!tep)[^\[\ns]*)*"
    rb"\[([A-Za-z][A-Za-z_]*+(?:-[A-Za-z_]++){0,3}-\d+|rank\d+)\][^\[\n]*?\bstep[=: ](\d+)\b[^\n]*? "
    rb"(\d+(?:\.\d+)?) ?([kKmM]?)tok/s)?[^\n]*)\n"
)
UNIT_BYTES = {b"": 1.0, b"k": 1e3, b"K": 1e3, b"m": 1e6, b"M": 1e6}
# A line that may carry progress (a rate or a step): only those are decoded and parsed the general way.
PROGRESS_HINT = re.compile(rb"/s|/it|tps|wps|_per_s|[Ss]tep|STEP|iteration")
