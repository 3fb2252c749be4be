"""The repro harness: replay a training step single- and multi-threaded, each phase in a child process.

`run_repro(ReproSpec(...))` (harness.py) returns a Report; child.py is what runs inside each phase's process.
"""
