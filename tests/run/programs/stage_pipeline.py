"""A healthy pipeline of three stages (decode -> augment -> pack), each an object with its own `self.lock` and its
own worker thread. A worker processes its batch under its lock and hands the result to the next stage under that
stage's lock, so the locks are always taken in pipeline order and no cycle can form; but at most moments two
workers each hold their own `self.lock` while waiting at the next stage's `with self.lock:` line. Ends by itself
after `sys.argv[1]` seconds (default 4) with exit 0."""
import sys
import threading
import time


class Stage:
    def __init__(self, name, downstream=None):
        self.name = name
        self.lock = threading.Lock()
        self.pending = []
        self.done = 0
        self.downstream = downstream

    def accept(self, items):
        with self.lock:
            self.pending.extend(items)

    def work(self, until):
        while time.monotonic() < until:
            with self.lock:
                batch, self.pending = self.pending, []
                time.sleep(0.05)  # the stage's own processing of the batch
                self.done += len(batch)
                if self.downstream is not None:
                    self.downstream.accept(batch)


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
    pack = Stage("pack")
    augment = Stage("augment", pack)
    decode = Stage("decode", augment)
    until = time.monotonic() + seconds
    workers = [threading.Thread(target=stage.work, args=(until,), name=f"{stage.name}-worker")
               for stage in (decode, augment, pack)]
    for worker in workers:
        worker.start()
    while time.monotonic() < until:
        decode.accept(range(8))
        time.sleep(0.01)
    for worker in workers:
        worker.join()
    print(f"packed {pack.done} items", flush=True)


if __name__ == "__main__":
    main()
