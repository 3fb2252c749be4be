"""Held-back generator: other names, deeper stacks, logger formats (outputs kept as benchmarks/logs_heldback)."""
import logging, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
import torch

mode = sys.argv[1]
traced = threading.Event()
release = threading.Event()
FX = "Detected that you are using FX to symbolically trace a dynamo-optimized function. This is not supported at the moment."

class Probe(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
    def forward(self, x):
        traced.set()
        release.wait(5)
        return self.proj(x)

def profiler():
    try:
        torch.fx.symbolic_trace(Probe())
    except Exception:
        pass

class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(8, 8)
    def forward(self, x):
        return self.head(x).relu()

def rollout_step(policy, x):
    return policy(x).sum()

def start_profiler():
    t = threading.Thread(target=profiler, name="profiler", daemon=True)
    t.start()
    traced.wait(5)

if mode == "patcher4":
    start_profiler()
    barrier = threading.Barrier(4)
    def rollout(i):
        policy, x = Policy(), torch.randn(2, 8)
        barrier.wait()
        rollout_step(policy, x)
    ths = [threading.Thread(target=rollout, args=(i,), name=f"rollout-{i}") for i in range(4)]
elif mode == "mixed":
    start_profiler()
    barrier = threading.Barrier(3)
    def work(i):
        policy, x = Policy(), torch.randn(2, 8)
        batch = {"input_ids": x}
        barrier.wait()
        if i == 0:
            rollout_step(policy, x)
        elif i == 1:
            raise RuntimeError(FX)
        else:
            batch["labels"]
    ths = [threading.Thread(target=work, args=(i,), name=f"worker-{i}") for i in range(3)]
elif mode == "logger":
    logging.basicConfig(format="%(asctime)s %(threadName)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    log = logging.getLogger("trainer")
    def drafter(i):
        for s in range(1, 4):
            try:
                if i == 1 and s == 2:
                    raise RuntimeError(FX)
                log.info("step=%d loss=%.3f 7.%d Ktok/s", s, 2.5 - 0.1 * s, i)
            except RuntimeError:
                log.exception("drafter step %d failed, skipping the batch", s)
            time.sleep(0.01)
    ths = [threading.Thread(target=drafter, args=(i,), name=f"drafter-{i}") for i in range(3)]
elif mode == "pool_logger":
    logging.basicConfig(format="%(levelname)s %(asctime)s [%(threadName)s] %(message)s", level=logging.INFO)
    log = logging.getLogger("rl")
    start_profiler()
    def shard(i):
        try:
            rollout_step(Policy(), torch.randn(2, 8))
            log.info("shard %d done", i)
        except NameError:
            log.exception("shard %d failed", i)
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(shard, range(2)))
    release.set()
    ths = []
for th in ths: th.start()
for th in ths: th.join()
release.set()
