"""The interruption: what an EventBridge notice (spot warning, rebalance recommendation, Auto Scaling
terminate action, AWS Health maintenance) means for the instances it names and the tasks on them. Pure.

- `classify`: an EventBridge event classified into act, ignore or reject: one parser per kind, one table;
- `notices`: the notices and decisions it makes, what is done for each kind (`actions`), and what was
  done (`NoticeOutcome`).

The envelope and input guards every classifier shares are in `spotguard.domain.envelope`; a task and
the one "managed?" rule in `spotguard.domain.tasks`; what the stack's settings change in
`spotguard.domain.settings`.
"""
