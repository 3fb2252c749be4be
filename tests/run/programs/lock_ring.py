"""Three stages pass work round a ring: each takes its own lock, then its neighbour's (stage i holds locks[i] and
wants locks[(i + 1) % 3]). Once all three hold their first lock the ring is closed: a deadlock of three locks that
no pair of threads shows alone. Prints 'ready PID' when the ring has formed."""
import os
import threading

locks = [threading.Lock() for _ in range(3)]
all_hold_one = threading.Barrier(4)


def stage(i):
    with locks[i]:
        all_hold_one.wait()
        with locks[(i + 1) % 3]:
            pass


def main():
    threads = [threading.Thread(target=stage, args=(i,), name=f"stage-{i}") for i in range(3)]
    for thread in threads:
        thread.start()
    all_hold_one.wait()
    print(f"ready {os.getpid()}", flush=True)
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
