"""The plain loop: the ground truth `repro` is held against (docs/races.md, "The plain loop").

Three threads start together, each runs a few steps of: random bf16 activations, a bf16 weight that requires grad,
a block-causal BlockMask built every step, q/k/v from one matmul, one module-level `torch.compile(flex_attention)`
(default arguments), a loss, backward. Nothing warms the cache first. No dflash-doctor code runs in the step.

    python benchmarks/gpu/plain_loop.py --shapes same --out result.json
    python benchmarks/gpu/plain_loop.py --shapes different --non-lazy-backward

The outcome is `ok`, `error` (a thread raised; the FX RuntimeError is named) or `hung` (no thread finished for
--hang-after seconds; every thread's innermost frames are kept). Knobs beyond the loop's own (--knob NAME) move
one property of the loop toward the reference drafter replay, to find which property decides the outcome.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback

FX_ERROR = "Detected that you are using FX to symbolically trace a dynamo-optimized function"
KNOBS = ("autocast", "gqa", "head16", "captured-mask", "tiny-shape", "recorder", "stagger", "replay-step")
# The fixes, applied the way a trainer applies them (the shim is dflash-doctor's runtime, the rest plain torch).
FIXES = ("shim", "warmup", "global-lock")


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", choices=("same", "different"), default="same")
    parser.add_argument("--threads", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--hang-after", type=float, default=40.0)
    parser.add_argument("--non-lazy-backward", action="store_true")
    parser.add_argument("--first-call-lock", action="store_true")
    parser.add_argument("--knob", action="append", default=[], choices=KNOBS)
    parser.add_argument("--fix", action="append", default=[], choices=FIXES)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default="-")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    started = time.perf_counter()
    events = []

    def mark(what, **detail):
        events.append({"t": round(time.perf_counter() - started, 4), "thread": threading.current_thread().name,
                       "what": what, **detail})

    import torch
    import torch._functorch.config
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if args.non_lazy_backward:
        torch._functorch.config.force_non_lazy_backward_lowering = True
    if "shim" in args.fix:
        from dflash_doctor.runtime import install_threadlocal_fx_flag

        install_threadlocal_fx_flag()
    if "recorder" in args.knob:
        from dflash_doctor import runtime

        runtime.install()
    try:
        from torch._dynamo.callback import callback_handler

        callback_handler.register_start_callback(lambda a: mark("compile-start", trigger=str(a.callback_trigger)))
        callback_handler.register_end_callback(lambda a: mark("compile-end", trigger=str(a.callback_trigger)))
    except (ImportError, AttributeError):
        pass
    flex = torch.compile(flex_attention)
    device = args.device
    gqa = "gqa" in args.knob or "tiny-shape" in args.knob
    head_dim = 16 if ("head16" in args.knob or "tiny-shape" in args.knob) else 64
    heads, kv_heads = 4, (2 if gqa else 4)
    batch = 16 if "tiny-shape" in args.knob else 1
    first_lock = threading.Lock()

    def length(index):
        if "tiny-shape" in args.knob:
            return 32
        return 512 if args.shapes == "same" else 256 * (index + 2)

    def step(index, step_no):
        seq = length(index)
        dtype = torch.float32 if "autocast" in args.knob else torch.bfloat16
        x = torch.randn(batch, seq, 256, device=device, dtype=dtype)
        width = head_dim * (heads + 2 * kv_heads)
        w = torch.randn(256, width, device=device, dtype=dtype, requires_grad=True)
        if "captured-mask" in args.knob:
            anchors = torch.arange(seq // 16, device=device)

            def mask_mod(b, h, q, kv):
                return anchors[q // 16] >= kv // 16
        else:
            def mask_mod(b, h, q, kv):
                return q // 16 >= kv // 16
        block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=seq, KV_LEN=seq, device=device)
        ctx = torch.autocast(device.split(":")[0], dtype=torch.bfloat16) if "autocast" in args.knob else _null()
        with ctx:
            qkv = x @ w
            q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
            q = q.view(batch, seq, heads, head_dim).transpose(1, 2)
            k = k.view(batch, seq, kv_heads, head_dim).transpose(1, 2)
            v = v.view(batch, seq, kv_heads, head_dim).transpose(1, 2)
            if step_no == 0:
                mark("first-call")
            out = flex(q, k, v, block_mask=block_mask, enable_gqa=gqa)
        if step_no == 0:
            mark("first-return")
        out.float().pow(2).mean().backward()
        if step_no == 0:
            mark("first-backward-done")

    replay_steps = []
    if "replay-step" in args.knob:
        from dflash_doctor.reference.replay import build_drafter_step

        replay_steps = [build_drafter_step(preset="tiny", device=device, shape_index=0 if args.shapes == "same" else i,
                                           seed=i).run for i in range(args.threads)]

    global_lock = threading.Lock()
    if "warmup" in args.fix:  # every thread's shape, forward and backward, once, in this thread
        for index in range(args.threads):
            step(index, 1)
        mark("warmup-done")

    results = [{"name": f"worker-{i}", "outcome": "running", "steps": 0, "error": None} for i in range(args.threads)]
    barrier = threading.Barrier(args.threads)

    def worker(index):
        record = results[index]
        barrier.wait()
        if "stagger" in args.knob:
            time.sleep(0.5 * index)
        try:
            for step_no in range(args.steps):
                if replay_steps:
                    if step_no == 0:
                        mark("first-call")
                    replay_steps[index]()
                    if step_no == 0:
                        mark("first-backward-done")
                elif args.first_call_lock and step_no == 0:
                    with first_lock:
                        step(index, step_no)
                elif "global-lock" in args.fix:
                    with global_lock:
                        step(index, step_no)
                else:
                    step(index, step_no)
                record["steps"] += 1
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            record["outcome"] = "ok"
        except Exception as exc:  # noqa: BLE001 - the outcome is the data
            record.update(outcome="error", error=f"{type(exc).__name__}: {str(exc)[:300]}",
                          fx_error=FX_ERROR in str(exc), traceback=traceback.format_exc(limit=6)[-1500:])
        mark("done", outcome=record["outcome"])

    threads = [threading.Thread(target=worker, args=(i,), name=f"worker-{i}", daemon=True)
               for i in range(args.threads)]
    for thread in threads:
        thread.start()
    deadline = time.perf_counter() + args.hang_after
    last_steps = -1
    while any(t.is_alive() for t in threads):
        time.sleep(0.2)
        steps = sum(r["steps"] for r in results)
        if steps != last_steps:
            last_steps, deadline = steps, time.perf_counter() + args.hang_after
        if time.perf_counter() > deadline:
            break
    hung = any(t.is_alive() for t in threads)
    report = {"argv": sys.argv[1:], "torch": torch.__version__, "threads": results, "events": events,
              "seconds": round(time.perf_counter() - started, 3)}
    if hung:
        report["outcome"] = "hung"
        report["stacks"] = _stacks()
    else:
        report["outcome"] = "error" if any(r["outcome"] != "ok" for r in results) else "ok"
    text = json.dumps(report, indent=1, default=str)
    if args.out == "-":
        print(text)
    else:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(text)
    sys.stdout.flush()
    os._exit(0)  # hung threads never return


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _stacks():
    names = {t.ident: t.name for t in threading.enumerate()}
    stacks = {}
    for ident, frame in sys._current_frames().items():
        frames = []
        while frame is not None:
            frames.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}:{frame.f_code.co_name}")
            frame = frame.f_back
        stacks[names.get(ident, f"thread-{ident}")] = frames[:14]
    return stacks


if __name__ == "__main__":
    sys.exit(main())
