"""Diagnose the user's own run, unmodified: `dflash-doctor run -- COMMAND` and `dflash-doctor attach PID`.

- session.py: what the supervisor tells every process it starts (the session folder, the config, the env);
- bootstrap/sitecustomize.py: the file Python imports at start-up in every such process (docs/run.md says why
  this mechanism and what it leaves alone);
- agent.py: what runs inside each of those processes (flight recorder, watchdog, fixes, the per-process record);
- records.py: the per-process record, typed, as it crosses from the child to the supervisor;
- supervisor.py: starts the command, forwards signals, kills leftovers, collects records, repeats trials;
- findings.py: records -> findings (rules/live.py, DFD9xx), shared with attach;
- attach.py: py-spy dumps of a live PID, classified by the same stack analyzer `logs` uses.

Nothing here imports torch at module level; the agent hooks torch when the user's code imports it.
"""
