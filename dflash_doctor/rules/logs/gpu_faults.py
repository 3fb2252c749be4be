"""A GPU kernel or allocation that failed: Triton out of resources (DFD510), CUDA out of memory (DFD502), an
illegal memory access (DFD511), a device-side assert (DFD517)."""
from __future__ import annotations

import re
from typing import Any, Dict

from dflash_doctor.findings import Severity
from dflash_doctor.rules.logs.model import declare
from dflash_doctor.rules.logs.shared import gpu_details, gpu_in, on_gpu, scan_for_uncompiled
from dflash_doctor.rules.registry import Rule


_TRITON_NEEDS = re.compile(r"out of resource: (?P<resource>[A-Za-z_ ]+?)(?:,|\.|$)(?:.*?Required: (?P<required>\d+))?"
                           r"(?:.*?Hardware limit:? (?P<limit>\d+))?")


def _triton_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    needs = _TRITON_NEEDS.search(text)
    if needs is None:
        return {"resource": None}
    return {"resource": needs.group("resource").strip(),
            "required": int(needs.group("required")) if needs.group("required") else None,
            "hardware_limit": int(needs.group("limit")) if needs.group("limit") else None}


def _triton_message(details: Dict[str, Any]) -> str:
    what = details.get("resource") or "a resource"
    need = ""
    if details.get("required") is not None and details.get("hardware_limit") is not None:
        need = f" (a kernel needs {details['required']:,}, the GPU has {details['hardware_limit']:,})"
    return f"Triton kernel out of {what}{need}: a kernel configuration, not CUDA memory"


LOG_TRITON_OUT_OF_RESOURCES = declare(Rule(
    code="DFD510",
    name="log-triton-out-of-resources",
    severity=Severity.ERROR,
    summary="a Triton kernel asked for more shared memory (or registers) than the GPU has",
    rationale=(
        "triton.runtime.errors.OutOfResources ('out of resource: shared memory, Required: N, Hardware limit: M') "
        "is raised when a generated kernel's block sizes and pipeline stages need more on-chip memory than the "
        "GPU offers. It is not a CUDA OOM: freeing memory or shrinking the batch changes nothing. It shows up with "
        "flex_attention and inductor kernels tuned for a bigger GPU (an H100 config on a smaller card), or with "
        "large head dimensions."
    ),
    fix=(
        "Give the kernel smaller tiles: flex_attention(..., kernel_options={'BLOCK_M': 64, 'BLOCK_N': 64, "
        "'num_stages': 1}), or let inductor autotune (mode='max-autotune'); a smaller head dimension also helps."
    ),
    example_format="log",
    bad=(
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/workspace/train.py", line 88, in <module>\n'
        "[rank0]:     loss = step(batch)\n"
        "[rank0]: torch._inductor.exc.InductorError: OutOfResources: out of resource: shared memory, Required: "
        "131072, Hardware limit: 101376. Reducing block sizes or `num_stages` may help.\n"
    ),
    good=(
        "[rank0]: step: 10  loss:  7.85  memory: 37.2GiB(39.16%)  tps: 5,856\n"
    ),
), triggers=("OutOfResources", "OutOfMemoryError: out of resource", "Hardware limit"), fatal=True,
    # (inductor re-raises it as 'OutOfMemoryError: out of resource: triton_tem_...'; a paste may keep only the
    # 'out of resource: shared memory, Required: N, Hardware limit: M' sentence)
    pattern=re.compile(r"\bOutOfResources\b|out of resource: "), details=_triton_details,
    describe=_triton_message)


_OOM_GPU = re.compile(r"GPU (?P<a>\d+) has a total capac?i?ty|\(GPU (?P<b>\d+);|\bOOM\b[^\n]{0,20}?\b(?:on|at) "
                      r"(?:device |GPU |cuda:|rank )(?P<c>\d+)|Out of memory error on GPU (?P<d>\d+)")
_OOM_TRIED = re.compile(r"Tried to allocate (?P<size>[\d.]+ ?[KMGT]?i?B)")


def _oom_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    gpu = _OOM_GPU.search(text)
    index = int(next(g for g in gpu.groups() if g is not None)) if gpu else gpu_in(text)
    tried = _OOM_TRIED.search(text)
    return {"gpu": index, "tried_to_allocate": tried.group("size") if tried else None}


def _per_gpu(worker: str, details: Dict[str, Any]) -> tuple:
    return (worker, details.get("gpu"))


LOG_CUDA_OOM = declare(Rule(
    code="DFD502",
    name="log-cuda-oom",
    severity=Severity.ERROR,
    summary="CUDA out of memory",
    rationale=(
        "An OOM kills the step (and, in a worker thread, the worker). The message names the GPU ('GPU 2 has a "
        "total capacity of ...'; torch 2.1 printed 'total capacty'; older torch: '(GPU 2; ... total capacity "
        "...)'; some trainers: 'OOM on device 2'), which the evidence carries so it can be joined with a GPU "
        "snapshot. Older and lower-level wordings count too ('cuda runtime error (2) : out of memory', THC's "
        "'error=2 : out of memory', 'CUDA error: out of memory', CUDA_ERROR_OUT_OF_MEMORY, cuBLAS's "
        "CUBLAS_STATUS_ALLOC_FAILED, torch.OutOfMemoryError named alone, as error reports list the class); the "
        "host's OOM killer is not one of them (DFD514), nor are Java's and Ray's OutOfMemoryError. In flex_attention "
        "pipelines an OOM inside sdpa_dense or math_attention means the uncompiled dense path ran (DFD505)."
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
), triggers=("of memory", "OOM", "Tried to allocate", "OUT_OF_MEMORY", "MemoryAllocation", "ALLOC_FAILED",
             "OutOfMemoryError"),
    fatal=True,
    # (PaddlePaddle's allocator: 'Out of memory error on GPU 0. Cannot allocate 6.93GB memory on GPU 0'; Java's and
    # Ray's OutOfMemoryError are host memory)
    pattern=re.compile(r"(?:CUDA|[Cc]uda|HIP|XPU) out of memory|Out of memory error on GPU \d"
                       r"|(?<!java\.lang\.)(?<!ray\.exceptions\.)OutOfMemoryError(?!: out of resource)|\bOOM\b[^\n]{0,20}?\b(?:on|at) "
                       r"(?:device|GPU|cuda:|rank) ?\d|Tried to allocate [\d.]+ ?[KMGT]?i?B \(GPU \d+; "
                       r"[\d.]+ ?[KMGT]?i?B total capacity"
                       # older and lower-level wordings: THC's 'cuda runtime error (2) : out of memory' and
                       # 'THCudaCheck FAIL ... error=2 : out of memory', 'CUDA error: out of memory', the driver
                       # and runtime enums, cuBLAS failing to allocate its workspace, spconv's tensorview
                       r"|[Cc][Uu][Dd][Aa] runtime error(?: \(2\))? ?: ?out of memory|\berror=2 : out of memory"
                       r"|CUDA error: out of memory|cuda failed with error 2 out of memory"
                       r"|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED"
                       # NCCL's own warning ('NCCL WARN Cuda failure 'out of memory''), MXNet's allocator
                       r"|Cuda failure 'out of memory'|cudaMalloc(?:Async)? failed: out of memory"),
    details=_oom_details, finding_key=_per_gpu, next_steps=scan_for_uncompiled("DFD502"),
    describe=lambda d: "CUDA out of memory" + on_gpu(d)
    + (f" (tried to allocate {d['tried_to_allocate']})" if d.get("tried_to_allocate") else ""))

LOG_CUDA_ILLEGAL_MEMORY_ACCESS = declare(Rule(
    code="DFD511",
    name="log-cuda-illegal-memory-access",
    severity=Severity.ERROR,
    summary="a CUDA kernel read or wrote memory it does not own (illegal memory access)",
    rationale=(
        "'CUDA error: an illegal memory access was encountered' is a kernel fault: an out-of-bounds index, a "
        "tensor used on the wrong device or after it was freed, or a bug in a custom or generated kernel. CUDA "
        "reports it asynchronously, so the Python frame in the traceback is often not the culprit, and the CUDA "
        "context is unusable afterwards: every later call on that GPU fails, and NCCL peers time out waiting. "
        "It is not an out-of-memory condition."
    ),
    fix=(
        "Rerun with CUDA_LAUNCH_BLOCKING=1 (and TORCH_USE_CUDA_DSA for device-side asserts) to get the real "
        "frame; check indices (embedding ids < vocab size) and devices of the tensors that kernel touches; "
        "compute-sanitizer names the faulting kernel."
    ),
    example_format="log",
    bad=(
        "[rank3]: Traceback (most recent call last):\n"
        '[rank3]:   File "/workspace/train.py", line 211, in step\n'
        "[rank3]:     loss.item()\n"
        "[rank3]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "[rank3]: CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
        "below might be incorrect.\n"
    ),
    good=(
        "[rank3]: step=40 loss=2.2 9.1 Ktok/s\n"
    ),
), triggers=("illegal memory access",), fatal=True,
    pattern=re.compile(r"an illegal memory access was encountered|cudaErrorIllegalAddress|CUDA_ERROR_ILLEGAL_ADDRESS"),
    details=gpu_details,
    describe=lambda d: "CUDA error: an illegal memory access was encountered" + on_gpu(d)
    + " (a kernel fault, not OOM)")

LOG_CUDA_DEVICE_ASSERT = declare(Rule(
    code="DFD517",
    name="log-cuda-device-assert",
    severity=Severity.ERROR,
    summary="a CUDA kernel's own assertion failed (device-side assert): usually an index out of range",
    rationale=(
        "'CUDA error: device-side assert triggered' means a kernel checked its input and stopped: most often a class "
        "label >= the number of classes (cross_entropy, nll_loss), a token id >= the embedding's vocabulary, an "
        "index out of range in gather/scatter/index_select, or a BCE input outside [0, 1]. The kernel's own line "
        "('Assertion `t >= 0 && t < n_classes` failed', printed per GPU thread with its 'block: [..], thread: [..]') "
        "names which, when it was captured, and alone is enough to report it. Like an illegal memory "
        "access it is reported asynchronously and leaves the CUDA context unusable; unlike one, the fix is in the "
        "data, not in a kernel."
    ),
    fix=(
        "Check the ranges of labels and indices against the model (num_classes, vocab size, padding ids); rerun on "
        "the CPU, or with CUDA_LAUNCH_BLOCKING=1, to get the failing line."
    ),
    example_format="log",
    bad=(
        "Traceback (most recent call last):\n"
        '  File "/workspace/train.py", line 139, in main\n'
        "    loss = F.cross_entropy(logits, labels)\n"
        "RuntimeError: CUDA error: device-side assert triggered\n"
    ),
    good=(
        "[rank0] step=10 loss=2.4 9.0 Ktok/s\n"
    ),
), triggers=("device-side assert", "Assertion `", "Device-side assertion `"), fatal=True,
    # The kernel prints its failed check per GPU thread before the host sees the error ('Indexing.cu:1308:
    # indexSelectLargeIndex: block: [56,0,0], thread: [0,0,0] Assertion `srcIndex < srcSelectDimSize` failed.');
    # a paste may keep only those lines.
    pattern=re.compile(r"device-side assert(?:ion)? triggered"
                       r"|block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] Assertion `"
                       r"|\.(?:cu|hip):\d+: \w+: Device-side assertion `"), details=gpu_details,  # ROCm's kernels
    describe=lambda d: "CUDA error: device-side assert triggered" + on_gpu(d)
    + " (a kernel's input check: an index or label out of range)")
