"""nn.DataParallel's replica threads on a CPU, where torch refuses to run them.

On a machine without an accelerator `nn.DataParallel` keeps no device ids and calls the module directly (no
replicas, no threads), `torch.nn.parallel.replicate` refuses a CPU device ("Expected a non cpu device") and
`parallel_apply` refuses to start ("Cannot access accelerator device when none is available"; torch 2.13). What
the CPU can still replay is the same thread shape: `ReplicaThreads` is a subclass of torch's own DataParallel, so
its `forward` is torch's (the frame Dynamo's trace rules skip, as on a GPU); only the four device steps are
replaced: scatter (chunks along dim 0), replicate (torch's replicate, line for line, with the device broadcast
replaced by views of the same tensors, which keeps the replicas' parameters non-leaf and their gradients flowing
to the original, as Broadcast does), parallel_apply (one unnamed thread per replica, the grad mode copied in, each
replica's exception wrapped "in replica N on device D" and re-raised in the caller, as torch does) and gather
(a concatenation). The replacements are skipped by Dynamo like torch's own files, so a `torch.compile` around the
whole wrapper meets the same frames it meets on a GPU. What the CPU cannot show: streams, devices, the autograd
device thread (a CPU backward runs on the calling thread) and anything that depends on them.
Imported only where torch is (the repro child).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Dict, List, Sequence

import torch
from torch import nn
from torch._utils import ExceptionWrapper

CPU = torch.device("cpu")


def _skipped_by_dynamo(function):
    """As torch's own parallel helpers are (torch._dynamo.trace_rules skips torch's files): the frame runs as
    Python, frames it calls are still compiled where a compile is active. Every function here is, or Dynamo would
    compile this module's tensor copies where it skips torch's."""
    return torch._dynamo.disable(function, recursive=False)


@_skipped_by_dynamo
def _copies(tensors: Sequence[torch.Tensor], replicas: int, detach: bool) -> List[List[torch.Tensor]]:
    """Broadcast onto one device: each replica gets a view (non-leaf, gradients flow back), or with `detach` a
    detached alias, as comm.broadcast_coalesced gives buffers. Plain loops: a comprehension is a frame of its own
    (Python 3.11), which Dynamo would compile where it skips torch's broadcast."""
    copies: List[List[torch.Tensor]] = []
    for _ in range(replicas):
        row = []
        for tensor in tensors:
            row.append(tensor.detach() if detach else tensor.view_as(tensor))
        copies.append(row)
    return copies


@_skipped_by_dynamo
def replicate(network: nn.Module, replicas: int, detach: bool = False) -> List[nn.Module]:
    """torch.nn.parallel.replicate (torch 2.11-2.15 read), with the device broadcast replaced by `_copies`."""
    params = list(network.parameters())
    param_indices = {param: idx for idx, param in enumerate(params)}
    param_copies = _copies(params, replicas, detach)
    buffers = list(network.buffers())
    buffer_indices = {buf: idx for idx, buf in enumerate(buffers)}
    buffer_copies = _copies(buffers, replicas, True)
    modules = list(network.modules())
    module_copies: List[List[nn.Module]] = [[] for _ in range(replicas)]
    module_indices: Dict[nn.Module, int] = {}
    for i, module in enumerate(modules):
        module_indices[module] = i
        for j in range(replicas):
            replica = module._replicate_for_data_parallel()
            replica._former_parameters = OrderedDict()
            module_copies[j].append(replica)
    for i, module in enumerate(modules):
        for key, child in module._modules.items():
            for j in range(replicas):
                if child is None:
                    module_copies[j][i]._modules[key] = None
                else:
                    setattr(module_copies[j][i], key, module_copies[j][module_indices[child]])
        for key, param in module._parameters.items():
            for j in range(replicas):
                replica = module_copies[j][i]
                if param is None:
                    replica._parameters[key] = None
                else:
                    copy = param_copies[j][param_indices[param]]
                    setattr(replica, key, copy)
                    replica._former_parameters[key] = copy  # type: ignore[index, operator]
        for key, buf in module._buffers.items():
            for j in range(replicas):
                if buf is None:
                    module_copies[j][i]._buffers[key] = None
                else:
                    setattr(module_copies[j][i], key, buffer_copies[j][buffer_indices[buf]])
    return [module_copies[j][0] for j in range(replicas)]


@_skipped_by_dynamo
def parallel_apply(modules: Sequence[nn.Module], inputs: Sequence[Any],
                   kwargs_tup: Sequence[Dict[str, Any]]) -> List[Any]:
    """torch.nn.parallel.parallel_apply's threads without the accelerator's device and stream contexts."""
    lock = threading.Lock()
    results: Dict[int, Any] = {}
    grad_enabled = torch.is_grad_enabled()

    @_skipped_by_dynamo
    def _worker(i: int, module: nn.Module, input: Any, kwargs: Dict[str, Any]) -> None:
        torch.set_grad_enabled(grad_enabled)
        try:
            if not isinstance(input, (list, tuple)):
                input = (input,)
            output = module(*input, **kwargs)
            with lock:
                results[i] = output
        except Exception:  # noqa: BLE001 - re-raised in the caller, as torch does
            with lock:
                results[i] = ExceptionWrapper(where=f"in replica {i} on device cpu")

    threads = [threading.Thread(target=_worker, args=(i, m, x, k))
               for i, (m, x, k) in enumerate(zip(modules, inputs, kwargs_tup))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    outputs = []
    for i in range(len(inputs)):
        output = results[i]
        if isinstance(output, ExceptionWrapper):
            output.reraise()
        outputs.append(output)
    return outputs


class ReplicaThreads(nn.DataParallel):
    """nn.DataParallel with `replicas` replicas on the CPU: torch's forward, CPU device steps."""

    def __init__(self, module: nn.Module, replicas: int) -> None:
        nn.Module.__init__(self)  # torch's __init__ keeps no device ids where there is no accelerator
        self.module = module
        self.dim = 0
        # torch keeps device indices here; the CPU has none, and only the count is read (forward's slices)
        self.device_ids = [CPU] * replicas  # type: ignore[list-item]
        self.output_device = CPU  # type: ignore[assignment]
        self.src_device_obj = CPU

    @_skipped_by_dynamo
    def scatter(self, inputs, kwargs, device_ids):
        count = len(device_ids)
        chunks = []
        for tensor in inputs:  # loops, not comprehensions: see _copies
            chunks.append(tensor.chunk(count, dim=self.dim))
        scattered, scattered_kwargs = [], []
        for i in range(count):
            row = []
            for chunk in chunks:
                row.append(chunk[i])
            scattered.append(tuple(row))
            scattered_kwargs.append(dict(kwargs or {}))
        return tuple(scattered), tuple(scattered_kwargs)

    @_skipped_by_dynamo
    def replicate(self, module, device_ids):
        return replicate(module, len(device_ids), not torch.is_grad_enabled())

    @_skipped_by_dynamo
    def parallel_apply(self, replicas, inputs, kwargs):
        return parallel_apply(replicas, inputs, kwargs)

    @_skipped_by_dynamo
    def gather(self, outputs, output_device):
        return torch.cat(list(outputs), dim=self.dim)


@_skipped_by_dynamo
def per_replica_apply(modules: Sequence[nn.Module], inputs: Sequence[Any], device: torch.device) -> List[Any]:
    """parallel_apply over modules the caller made per replica: torch's own on an accelerator, the CPU threads
    above on a CPU."""
    kwargs: List[Dict[str, Any]] = [{} for _ in modules]
    if device.type == "cpu":
        return parallel_apply(modules, inputs, kwargs)
    from torch.nn.parallel import parallel_apply as torch_parallel_apply

    return torch_parallel_apply(list(modules), list(inputs), kwargs, [device] * len(modules))
