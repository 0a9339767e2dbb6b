"""A job and its state machine. Pure: no boto3, no clock, no I/O.

A job is one training run that SpotGuard keeps alive: the RunTask request it was submitted with, its
options, and its attempts (one ECS task each). The whole job is one ledger item, written with a
compare-and-set on `rev`, so every transition is atomic and a job never has two live attempts:

    queued ──launch──► launching ──task started──► running ──task stopped──► succeeded | failed |
      ▲                   │                           │                     cancelled | gave-up
      └──RunTask failed───┘ (retry queue, growing     └──interrupted / exit 75 / error retry──► queued
                              delays)                    (EBS mode: ──► snapshotting ──► queued)

The modules, one reason to change each:
- `model`: the job, its state and its attempts, and the names SpotGuard gives its tasks;
- `submission`: the RunTask request a job was submitted with, and its options;
- `effects`: what a transition asks the use case to do once the new job is written;
- `transitions`: the state machine for the job's tasks: task events, cancel and resubmit, moves, the stop
  of an attempt that waits for an instance;
- `launches`: the launch transitions: a launch begun (or a wait for capacity), RunTask's answer;
- `endings`: the end of the running attempt (succeeded, failed, cancelled, or queued again), the pools
  it avoids after, its oldest attempts folded;
- `gangs`: a multi-node job's own steps (forming, and ending: one node's stop is everyone's);
- `spares`: the early replacement: the next instance boots while the warned task checkpoints;
- `ebs`: the transitions of EBS mode (the stopped attempt's volume snapshotted, old volumes deleted);
- `stops`: why a task stopped, and what that means for its job;
- `placement`: where a job runs: the capacity decisions, what the policy is told, the RunTask placement;
- `request`: the RunTask parameters of an attempt (environment, tags, EBS volume, avoid constraints);
- `run_errors`: what an error from RunTask means for a job;
- `adoption`: a task SpotGuard did not start, tagged to be managed, becomes a job;
- `task_events`: what one record on the task-events queues is;
- `commands`: what the jobs function takes by hand and what it answers;
- `answers`: what it answers about a job: a summary and the full status;
- `replies`: what the adapters answer to the jobs use case;
- `spend`: GPU-hours and money spent and lost.

Every transition takes a job and returns a `Step`: the new job plus the effects to carry out (launch,
stop, notify, snapshot, clean up). The use case writes the new job first and then does the effects, each
of which is safe to repeat (RunTask has a client token, StopTask and notifications are idempotent or
harmless twice).

This file imports nothing, so that importing one module of the package loads only what it needs.
"""
