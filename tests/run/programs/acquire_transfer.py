"""Two transfers between the same two accounts in opposite directions, with explicit acquire()/release() (no
`with`): each takes its source account's lock, then its destination's. Both hold their first: a deadlock.
Prints 'ready PID' once both hold their first lock."""
import os
import threading


class Account:
    def __init__(self, owner, balance):
        self.owner = owner
        self.balance = balance
        self.lock = threading.Lock()


both_hold_one = threading.Barrier(3)


def transfer(source, target, amount):
    source.lock.acquire()
    try:
        both_hold_one.wait()
        target.lock.acquire()
        try:
            source.balance -= amount
            target.balance += amount
        finally:
            target.lock.release()
    finally:
        source.lock.release()


def main():
    alice, bob = Account("alice", 100), Account("bob", 50)
    payments = [threading.Thread(target=transfer, args=(alice, bob, 10), name="pay-bob"),
                threading.Thread(target=transfer, args=(bob, alice, 5), name="pay-alice")]
    for thread in payments:
        thread.start()
    both_hold_one.wait()
    print(f"ready {os.getpid()}", flush=True)
    for thread in payments:
        thread.join()


if __name__ == "__main__":
    main()
