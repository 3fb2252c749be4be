"""One drafter training step's pieces: the batch a target worker hands over, and the drafter loss on it.

Nothing here waits for the GPU: sampling reads the lengths' CPU copy, and what goes from host to device goes
from pinned memory without blocking. A pageable host-to-device copy (or any `.item()`) waits for every kernel
queued before it, so the CPU could never run ahead and each of those waits would leave the GPU idle while the
next kernels are launched.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, Optional

import torch

from dflash_doctor.reference import mask as masks
from dflash_doctor.reference.attention import attention_for
from dflash_doctor.reference.config import PipelineConfig
from dflash_doctor.reference.loss import block_labels, chunked_loss, loss_weights


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without waiting for the device's queue (through pinned memory)."""
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


@dataclass
class TargetBatch:
    tokens: torch.Tensor  # (batch, seq) ids, padding past each length
    lengths: torch.Tensor  # (batch,) on the batch's device
    features: torch.Tensor  # (batch, seq, F * hidden)
    greedy: torch.Tensor  # (batch, seq)
    lengths_cpu: torch.Tensor  # (batch,) the same lengths on the host, for sampling without a device sync
    ready: Optional[torch.cuda.Event] = None  # recorded on the producer's stream once the tensors are written

    def to(self, device: torch.device) -> "TargetBatch":
        if self.tokens.device == device:
            return self
        tokens, lengths, features, greedy = (t.to(device, non_blocking=True) for t in self.device_tensors())
        return TargetBatch(tokens, lengths, features, greedy, self.lengths_cpu)

    def device_tensors(self):
        return self.tokens, self.lengths, self.features, self.greedy

    @property
    def num_tokens(self) -> int:
        return int(self.lengths_cpu.sum())


class StreamHandoff:
    """Target workers (threads) produce on a CUDA stream of their own per device, so the GPU can run a target's
    forward (matmul-bound) while a drafter's step (with its memory-bound stretches) runs on the default stream.
    The producer records an event when a batch is written; the consumer's stream waits for it, and the batch's
    memory is marked as used by the consumer's stream so the allocator cannot give it back to the producer's
    stream before the consumer is done with it. On a CPU every call is a no-op."""

    def __init__(self, devices: Iterable[str]) -> None:
        self.streams: Dict[str, torch.cuda.Stream] = {
            d: torch.cuda.Stream(torch.device(d)) for d in dict.fromkeys(devices) if d.startswith("cuda")}

    @contextmanager
    def producing(self, device: str) -> Iterator[None]:
        stream = self.streams.get(device)
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            yield

    def mark(self, batch: "TargetBatch") -> "TargetBatch":
        stream = self.streams.get(str(batch.tokens.device))
        if stream is not None:
            batch.ready = torch.cuda.Event()
            batch.ready.record(stream)
        return batch

    @staticmethod
    def receive(batch: "TargetBatch", device: torch.device) -> "TargetBatch":
        if batch.ready is not None:
            consumer = torch.cuda.current_stream(batch.tokens.device)
            consumer.wait_event(batch.ready)
            for tensor in batch.device_tensors():
                tensor.record_stream(consumer)
        return batch.to(device)


def random_lengths(cfg: PipelineConfig, batch: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(cfg.min_len, cfg.seq_len + 1, (batch,), generator=generator)


def pad_past_lengths(tokens: torch.Tensor, lengths: torch.Tensor, pad_id: int) -> torch.Tensor:
    past = torch.arange(tokens.shape[1], device=tokens.device)[None, :] >= lengths.to(tokens.device)[:, None]
    return tokens.masked_fill(past, pad_id)


def autocast_for(device: torch.device):
    """bf16 autocast on CUDA (fp32 master weights); a no-op context on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast(
        "cpu", enabled=False)


def drafter_loss(drafter, batch: TargetBatch, cfg: PipelineConfig, anchor_generator: torch.Generator,
                 attention_path: str, checkpoint: str) -> torch.Tensor:
    """Sample anchors, build this step's mask, run the drafter and return the weighted chunked loss (a device
    scalar: reading it is the caller's choice, and a sync)."""
    device = batch.tokens.device
    block = cfg.block_size
    anchors = to_device(masks.sample_anchors(batch.lengths_cpu, cfg.prompt_len, block, cfg.blocks_per_seq,
                                             anchor_generator), device)
    attend = attention_for(attention_path, anchors, batch.tokens.shape[1], block)
    ids = masks.block_inputs(batch.tokens, anchors, block, cfg.mask_token_id)
    with autocast_for(device):
        hidden = drafter(batch.features, ids, masks.block_positions(anchors, block), attend)
        labels = block_labels(batch.greedy, anchors, block)
        weights = loss_weights(anchors, batch.lengths, block, cfg.loss_decay)
        return chunked_loss(hidden, drafter.norm, drafter.shared["lm_head"], labels, weights, cfg.loss_chunk,
                            checkpoint, cfg.compile_dense)
