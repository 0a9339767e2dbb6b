"""A job and its state machine. Pure: no boto3, no clock, no I/O.

A job is one training run that SpotGuard keeps alive: the RunTask request it was submitted with, its
options, and its attempts (one ECS task each). The whole job is one ledger item, written with a
compare-and-set on `rev`, so every transition is atomic and a job never has two live attempts:

    queued ──launch──► launching ──task started──► running ──task stopped──► succeeded | failed |
      ▲                   │                           │                     cancelled | gave-up
      └──RunTask failed───┘ (retry queue, growing     └──interrupted / exit 75 / error retry──► queued
                              delays)                    (EBS mode: ──► snapshotting ──► queued)

The modules, one reason to change each:
- `model`: the job, its attempts, its options and the RunTask request it was submitted with;
- `effects`: what a transition asks the use case to do once the new job is written;
- `transitions`: the state machine: launches, task events, cancel and resubmit;
- `ebs`: the transitions of EBS mode (the stopped attempt's volume snapshotted, old volumes deleted);
- `request`: the RunTask parameters of an attempt (environment, tags, EBS volume, avoid constraints);
- `spend`: GPU-hours and money spent and lost.

Every transition takes a job and returns a `Step`: the new job plus the effects to carry out (launch,
stop, notify, snapshot, clean up). The use case writes the new job first and then does the effects, each
of which is safe to repeat (RunTask has a client token, StopTask and notifications are idempotent or
harmless twice).

This file imports nothing, so that importing one module of the package loads only what it needs.
"""
