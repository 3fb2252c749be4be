"""Training-log rules (DFD5xx): what `dflash-doctor logs` finds while streaming a log.

Examples use example_format "log": plain log excerpts, scanned by `dflash_doctor.logs.examples.run_example`.
A first line `# --flags` would carry options; none of these examples needs any.
"""
from dflash_doctor.findings import Severity
from dflash_doctor.rules.registry import Rule, register

LOG_FX_TRACE_RACE = register(Rule(
    code="DFD501",
    name="log-fx-trace-race",
    severity=Severity.ERROR,
    summary="a worker died of the FX-tracing race: 'Detected that you are using FX to symbolically trace a "
    "dynamo-optimized function'",
    rationale=(
        "torch.compile'd functions check a process-global FX-tracing flag on every call. While one thread "
        "compiles (make_fx sets the flag), another thread calling compiled code raises this RuntimeError, and "
        "with the thread's loop gone its GPU keeps its memory at 0 % utilization. It is a race, not a bug in the "
        "traced function: a warm compile cache hides it, deleting the cache brings it back."
    ),
    fix=(
        "Warm every shape in one thread before starting workers, or serialise compiled steps; `dflash-doctor "
        "guards` shows the installed torch's guard, `dflash-doctor repro --matrix` which mitigation works here."
    ),
    example_format="log",
    bad=(
        "Exception in thread drafter-0:\n"
        "Traceback (most recent call last):\n"
        '  File "/workspace/train.py", line 640, in run\n'
        "    out = flex(q, k, v, block_mask=mask)\n"
        '  File "/usr/lib/python3.12/site-packages/torch/_dynamo/eval_frame.py", line 843, in compile_wrapper\n'
        "    raise RuntimeError(\n"
        "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function. "
        "This is not supported at the moment.\n"
    ),
    good=(
        "[drafter-0] step=120 loss=2.41 7.2 Ktok/s\n"
        "[drafter-1] step=120 loss=2.43 7.1 Ktok/s\n"
    ),
))

LOG_CUDA_OOM = register(Rule(
    code="DFD502",
    name="log-cuda-oom",
    severity=Severity.ERROR,
    summary="CUDA out of memory",
    rationale=(
        "An OOM kills the step (and, in a worker thread, the worker). The message names the GPU ('GPU 2 has a "
        "total capacity of ...'; older torch: '(GPU 2; ... total capacity ...)'), which the evidence carries so it "
        "can be joined with a GPU snapshot. In flex_attention pipelines an OOM inside sdpa_dense or "
        "math_attention means the uncompiled dense path ran (DFD505)."
    ),
    fix="Check DFD505 first; otherwise reduce batch or sequence length on that GPU.",
    example_format="log",
    bad=(
        "Exception in thread drafter-2:\n"
        "Traceback (most recent call last):\n"
        '  File "/workspace/train.py", line 702, in run\n'
        "    loss.backward()\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 12.00 GiB. GPU 7 has a total capacity of "
        "139.81 GiB of which 3.12 GiB is free. Including non-PyTorch memory, this process has 136.68 GiB memory "
        "in use.\n"
    ),
    good=(
        "[drafter-2] step=300 loss=2.10 7.0 Ktok/s\n"
    ),
))

LOG_THROUGHPUT_DROP = register(Rule(
    code="DFD503",
    name="log-throughput-drop",
    severity=Severity.WARNING,
    summary="sustained throughput drop against the thread's rolling baseline",
    rationale=(
        "Throughput (tok/s, Ktok/s, Mtok/s) is tracked per thread. The baseline is the median of the last "
        "--baseline-window samples; a drop fires when --sustain consecutive samples are all more than --drop "
        "below it, so one noisy line never fires. After a drop the baseline restarts from the new level. A "
        "healthy-looking log whose throughput halves usually means a worker died or fell back to a slow path."
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
))

LOG_NCCL_TIMEOUT = register(Rule(
    code="DFD504",
    name="log-nccl-timeout",
    severity=Severity.ERROR,
    summary="NCCL collective timed out or the process-group watchdog fired",
    rationale=(
        "ProcessGroupNCCL's watchdog aborts a collective that ran past its timeout ('Watchdog caught collective "
        "operation timeout: WorkNCCL(...) ran for N milliseconds before timing out'). One rank that stopped "
        "calling collectives, for example because its worker thread died, hangs every other rank until then. "
        "One finding per rank; repeats are counted in the evidence."
    ),
    fix="Find the rank that stopped first (its last step is lowest in the facts) and why it stopped.",
    example_format="log",
    bad=(
        "[rank3]:[E321 02:07:08.414640780 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, "
        "Timeout(ms)=600000) ran for 600067 milliseconds before timing out.\n"
    ),
    good=(
        "[rank3]:[I321 02:07:08.414640780 ProcessGroupNCCL.cpp:2012] [PG 0 Rank 3] ProcessGroupNCCL initialized\n"
    ),
))

LOG_DENSE_ATTENTION_FALLBACK = register(Rule(
    code="DFD505",
    name="log-dense-attention-fallback",
    severity=Severity.WARNING,
    summary="flex_attention ran its uncompiled dense path",
    rationale=(
        "torch warns 'flex_attention called without torch.compile() - this will use an unfused implementation "
        "that materializes the full scores matrix' when flex_attention runs eagerly, and a traceback through "
        "sdpa_dense or math_attention shows the same path. With error_on_nested_fx_trace=False the FX race also "
        "lands here silently. The dense path is slow and, at training lengths, runs out of memory."
    ),
    fix="Call flex_attention through torch.compile, and do not silence error_on_nested_fx_trace (DFD301).",
    example_format="log",
    bad=(
        "/usr/lib/python3.12/site-packages/torch/nn/attention/flex_attention.py:1601: UserWarning: flex_attention "
        "called without torch.compile() - this will use an unfused implementation that materializes the full "
        "scores matrix instead of generating a fused kernel.\n"
    ),
    good=(
        "[drafter-1] compiled flex_attention for seq_len=4096\n"
    ),
))

LOG_RECOMPILE_LIMIT = register(Rule(
    code="DFD506",
    name="log-recompile-limit",
    severity=Severity.WARNING,
    summary="Dynamo hit its recompile limit: the function now runs uncompiled",
    rationale=(
        "After config.recompile_limit (cache_size_limit before torch 2.6) recompilations of one code object, "
        "Dynamo stops compiling it and runs it eagerly: for flex_attention that is the dense path. Shapes that "
        "change every step (dynamic block masks, ragged batches) are the usual cause."
    ),
    fix="Mark the varying dimension dynamic, pad to a few bucket sizes, or raise the limit knowingly.",
    example_format="log",
    bad=(
        "W1129 10:02:11.123000 4242 torch/_dynamo/convert_frame.py:1016] torch._dynamo hit "
        "config.recompile_limit (8)\n"
        "W1129 10:02:11.123000 4242 torch/_dynamo/convert_frame.py:1016]    function: 'attend' "
        "(/workspace/dflash_model.py:211)\n"
        "W1129 10:02:11.123000 4242 torch/_dynamo/convert_frame.py:1016]    last reason: 0/7: "
        "tensor 'q' size mismatch at index 2. expected 4096, actual 4160\n"
    ),
    good=(
        "W1129 10:02:11.123000 4242 torch/_dynamo/convert_frame.py:1016] torch._dynamo recompiling 'attend'\n"
    ),
))

LOG_THREAD_STALLED = register(Rule(
    code="DFD507",
    name="log-thread-stalled",
    severity=Severity.WARNING,
    summary="a thread stopped making step progress while the others kept going",
    rationale=(
        "A worker that logs step=N and then nothing while its peers advance is hung (a deadlock on Dynamo's "
        "compile lock against the autograd device thread is the known one) or died without a traceback in this "
        "log. It fires when another thread advanced by --stall-steps steps (at least three of the stalled "
        "thread's own step increments) since the stalled thread's last progress line. Threads whose death "
        "is reported (DFD501, DFD502, DFD508) are not repeated here."
    ),
    fix="Dump all thread stacks of the live process (py-spy dump --pid PID) to see where it waits.",
    example_format="log",
    bad=(
        "[drafter-0] step=1 7.1 Ktok/s\n[drafter-1] step=1 7.2 Ktok/s\n"
        "[drafter-0] step=2 7.1 Ktok/s\n[drafter-1] step=2 7.2 Ktok/s\n"
        + "".join(f"[drafter-1] step={n} 7.2 Ktok/s\n" for n in range(3, 60))
    ),
    good=(
        "".join(f"[drafter-0] step={n} 7.1 Ktok/s\n[drafter-1] step={n} 7.2 Ktok/s\n" for n in range(1, 60))
    ),
))

LOG_THREAD_DIED = register(Rule(
    code="DFD508",
    name="log-thread-died",
    severity=Severity.ERROR,
    summary="a thread died with an exception",
    rationale=(
        "'Exception in thread NAME:' is Python's threading.excepthook reporting a thread whose target raised: "
        "the thread is gone and whatever it fed (a GPU, a queue) is starved. Reported when no more specific rule "
        "(DFD501, DFD502, DFD504) explains the exception."
    ),
    fix="Read the exception; `dflash-doctor status` joins it with the GPU the thread left idle.",
    example_format="log",
    bad=(
        "Exception in thread target-3:\n"
        "Traceback (most recent call last):\n"
        '  File "/workspace/train.py", line 512, in run\n'
        "    batch = queue.get(timeout=600)\n"
        "_queue.Empty\n"
    ),
    good=(
        "[target-3] step=80 5.0 Ktok/s\n"
    ),
))
