"""The interruption: what an EventBridge notice (spot warning, rebalance recommendation, Auto Scaling
terminate action, AWS Health maintenance) means for the instances it names and the tasks on them. Pure.

- `notices`: an event classified into act, ignore or reject, and what is done for each kind (`actions`).

The envelope and input guards every classifier shares are in `spotguard.domain.envelope`; a task and
the one "managed?" rule in `spotguard.domain.tasks`; what the stack's settings change in
`spotguard.domain.settings`.
"""
