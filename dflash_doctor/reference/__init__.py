"""The bundled reference DFlash pipeline: a frozen target, a DFlash drafter, and the workers that train it.

Importing the package imports nothing heavy; the modules that need torch import it themselves.

    config.py       presets and sizes (plain data)           results.py   plan, outcomes, result, Progress (no torch)
    layers.py       RMSNorm, RoPE, SwiGLU, q/k/v, seeding    target.py    the frozen target (random or Hugging Face)
    drafter.py      the DFlash drafter                        mask.py      anchors, mask_mod, BlockMask / dense mask
    attention.py    compiled flex_attention | dense SDPA      loss.py      position-decayed chunked cross-entropy
    training.py     the batch, the loss step, stream hand-off corpus.py    the shared greedy corpus (static decode)
    graphs.py       CUDA graphs with eager fallback           roles.py     what a target / drafter worker does
    setup.py        set-up: mitigations, models, corpus,      loop.py      the target and drafter loops (threads and
                    graphs, warm-up (its own phase)                        processes share them), --fail-worker
    transport.py    IPC queues, NCCL / gloo groups            signals.py   SIGINT / SIGTERM: stop, partial report
    workers_threads.py / workers_processes.py                 findings.py  run facts -> DFD8xx findings
                    start, supervise (stall watchdog), shut down, collect
    pipeline.py     options -> plan -> run (+ FLOPs, MFU)     replay.py    one drafter step for `repro`
    checkpoint_files.py  atomic save / resume (DrafterCheckpoint, checked on read)   flops.py  FLOPs per token, MFU
    worker_messages.py   what a rank tells its parent (processes), typed, and their one codec
"""
