"""The jobs use cases, one module each:

- `service`: submit, resubmit, cancel, status and list, and the events that move a job (task state
  changes, retry messages, EBS snapshots);
- `engine`: the one loop every change goes through (transition, compare-and-set, effects, drive);
- `adoption`: tasks SpotGuard did not start that it manages;
- `ebs`: EBS mode (a volume per attempt, snapshotted when the task stops);
- `reconcile`: the scheduled sweep that makes sure nothing is lost when an event is.
"""
