"""GPU snapshot rules (DFD4xx): what `dflash-doctor gpus` reads from NVML samples or nvidia-smi CSV.

Examples use example_format "nvidia-smi-csv". Their first line is a comment with the flags the example needs
(`# --roles target=0-2,drafter=3-4 --memory-total 81559`); `dflash_doctor.gpus.examples.run_example` applies it.
A `live:` part lists the processes a fake NVML reports (`gpu:pid=state`), for the live-only rule DFD404.
"""
from dflash_doctor.findings import Severity
from dflash_doctor.rules.registry import Rule, register

GPU_IDLE_MEMORY_HELD = register(Rule(
    code="DFD401",
    name="gpu-idle-memory-held",
    severity=Severity.ERROR,
    summary="GPU holds memory at near-zero utilization while other GPUs of the job work: a stalled or dead worker",
    rationale=(
        "A worker that dies inside a multi-threaded trainer (the seeds' drafter-0, killed by the FX-tracing race) "
        "leaves its tensors and CUDA context allocated: nvidia-smi shows tens of GB held at 0 %. Nothing frees the "
        "memory until the process exits, and the pipeline keeps running at reduced capacity. Utilization is "
        "averaged over several samples (live) or several CSV rows of the same GPU, so one quiet instant does not "
        "fire. It needs another GPU of the job at work: when every loaded GPU is idle the job may still be "
        "loading, which is DFD406."
    ),
    fix="Find the dead worker: `dflash-doctor status --log train.log --from snapshot.csv` names the thread and why.",
    example_format="nvidia-smi-csv",
    bad=(
        "# --roles drafter=0-2\n"
        "0, 46705 MiB, 0 %\n"
        "1, 77903 MiB, 85 %\n"
        "2, 81247 MiB, 100 %\n"
    ),
    good=(
        "# --roles drafter=0-2\n"
        "0, 79012 MiB, 93 %\n"
        "1, 77903 MiB, 85 %\n"
        "2, 81247 MiB, 100 %\n"
    ),
))

GPU_ROLE_IMBALANCE = register(Rule(
    code="DFD402",
    name="gpu-role-imbalance",
    severity=Severity.WARNING,
    summary="GPU far below the busy level of its role peers",
    rationale=(
        "GPUs with the same role in a pipeline should be about equally busy. The role's busy level is the median "
        "of its busiest half, so one saturated GPU does not set the bar alone and a majority of starved GPUs "
        "(the seeds' target GPUs 0, 3 and 4 at 6-11 % beside 1 and 2 at 100 %) does not hide the imbalance the way "
        "a plain median would. A GPU fires when it is both --imbalance-gap points and --imbalance-ratio times "
        "below that level. Without --roles every GPU is a peer of every other. GPUs already reported as "
        "DFD401 are not repeated here, and a GPU holding less than --min-held (a bare CUDA context) is not running "
        "the job and is nobody's peer."
    ),
    fix="Look upstream of the starved GPUs: a dead producer thread or a stalled queue starves its consumers.",
    example_format="nvidia-smi-csv",
    bad=(
        "# --roles target=0-4\n"
        "0, 74989 MiB, 11 %\n"
        "1, 82027 MiB, 100 %\n"
        "2, 96783 MiB, 100 %\n"
        "3, 73723 MiB, 6 %\n"
        "4, 86139 MiB, 11 %\n"
    ),
    good=(
        "# --roles target=0-4\n"
        "0, 74989 MiB, 91 %\n"
        "1, 82027 MiB, 100 %\n"
        "2, 86783 MiB, 100 %\n"
        "3, 73723 MiB, 88 %\n"
        "4, 86139 MiB, 97 %\n"
    ),
))

GPU_MEMORY_NEAR_CAPACITY = register(Rule(
    code="DFD403",
    name="gpu-memory-near-capacity",
    severity=Severity.WARNING,
    summary="GPU memory used is near its capacity",
    rationale=(
        "A GPU above --near-capacity percent of its memory is one allocation away from a CUDA OOM; in the seeds' "
        "pipeline the uncompiled flex_attention fallback materialises the full score matrix and tips it over. "
        "Needs memory.total: from NVML, a memory.total CSV column, or --memory-total. Without it the check is "
        "skipped and the report says so."
    ),
    fix="Lower the batch or sequence length on that GPU, or check for the dense attention fallback (DFD505).",
    example_format="nvidia-smi-csv",
    bad=(
        "# --memory-total 97871\n"
        "0, 82027 MiB, 100 %\n"
        "1, 96783 MiB, 100 %\n"
    ),
    good=(
        "# --memory-total 143771\n"
        "0, 82027 MiB, 100 %\n"
        "1, 96783 MiB, 100 %\n"
    ),
))

GPU_PROCESS_GONE = register(Rule(
    code="DFD404",
    name="gpu-process-gone",
    severity=Severity.ERROR,
    summary="GPU memory held by a process that is dead or a zombie",
    rationale=(
        "NVML still lists a compute process and its memory, but the process is a zombie or no longer exists: the "
        "memory will not come back until its parent reaps it or the driver cleans up. Live mode only. NVML reports "
        "host PIDs, so inside a container a PID can be invisible without being dead: a missing PID counts as gone "
        "only when another NVML PID resolves here (same PID namespace); zombies always count."
    ),
    fix="Reap or kill the parent of the zombie (ps -o ppid= -p PID); check `nvidia-smi` again afterwards.",
    example_format="nvidia-smi-csv",
    bad=(
        "# live: 0:4242=zombie 1:4243=running\n"
        "0, 46705 MiB, 0 %\n"
        "1, 78000 MiB, 97 %\n"
    ),
    good=(
        "# live: 0:4242=running 1:4243=running\n"
        "0, 76705 MiB, 95 %\n"
        "1, 78000 MiB, 97 %\n"
    ),
))

GPU_IDLE_EMPTY_BESIDE_BUSY = register(Rule(
    code="DFD405",
    name="gpu-idle-empty-beside-busy-peers",
    severity=Severity.WARNING,
    summary="GPU idle and (nearly) empty while its role peers are busy: likely a worker that died and freed it",
    rationale=(
        "A rank or worker process that crashed exits and its GPU memory is freed: what is left is a GPU at 0 % "
        "holding nothing, or only a bare CUDA context, beside peers of the same role at work. That is what a "
        "crashed rank looks like in nvidia-smi, the opposite of DFD401 (a dead thread inside a live process keeps "
        "its memory). Peers count as busy above --busy-util % while holding at least --min-held. Without --roles "
        "every GPU is a peer of every other, so an unused GPU on a shared machine fires too: pass --roles."
    ),
    fix=("Find the worker that ran on it: `dflash-doctor logs train.log` (a rank's traceback, a signal, torchrun's "
         "root cause) or `dflash-doctor status --log train.log --from snapshot.csv --roles ...`."),
    example_format="nvidia-smi-csv",
    bad=(
        "# --roles target=0-3\n"
        "0, 71002 MiB, 97 %\n"
        "1, 70890 MiB, 95 %\n"
        "2, 0 MiB, 0 %\n"
        "3, 70994 MiB, 88 %\n"
    ),
    good=(
        "# --roles target=0-3\n"
        "0, 71002 MiB, 97 %\n"
        "1, 70890 MiB, 95 %\n"
        "2, 70917 MiB, 91 %\n"
        "3, 70994 MiB, 88 %\n"
    ),
))

GPU_ALL_IDLE = register(Rule(
    code="DFD406",
    name="gpu-all-idle",
    severity=Severity.INFO,
    summary="every loaded GPU is idle: still loading, or the whole job is stuck",
    rationale=(
        "When every GPU of the job holds memory and none works, one snapshot cannot tell a job that is still "
        "loading weights or compiling (minutes of idle GPUs are normal then) from a job that hangs (a NCCL "
        "collective waiting for a dead rank, a deadlock). So one snapshot is information only; when several "
        "samples over time (--samples, or nvidia-smi -l rows) show the GPUs staying idle, it is a warning. Per-GPU "
        "DFD401 is not raised in this case: with nothing at work there is no peer to compare with."
    ),
    fix=("Sample again over a minute (`dflash-doctor gpus --samples 60 --interval 1`); if it stays idle, dump the "
         "stacks (`py-spy dump --pid PID`) and read the log (`dflash-doctor logs train.log`)."),
    example_format="nvidia-smi-csv",
    bad=(
        "# --roles target=0-1\n"
        "0, 61002 MiB, 0 %\n"
        "1, 60890 MiB, 1 %\n"
    ),
    good=(
        "# --roles target=0-1\n"
        "0, 61002 MiB, 93 %\n"
        "1, 60890 MiB, 95 %\n"
    ),
))

# A GPU idle beside working peers, the mark of a worker that stopped there: `status` joins these GPUs to the log's
# dead workers, and the gpus report's next step sends the reader to `status`.
IDLE_BESIDE_PEERS = (GPU_IDLE_MEMORY_HELD.code, GPU_IDLE_EMPTY_BESIDE_BUSY.code)
