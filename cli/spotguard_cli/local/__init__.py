"""`spotguard local demo | up | inject | replay`: the whole system on this machine (see emulator/system.py).

command.py   the `local` command: its actions' parsers, each from its module
demo.py      `local demo`: the scenario's arguments, and the interruption scenario
capacity.py  `local demo --scenario capacity`: a deadline job moved between pools by the capacity policy
gang.py      `local demo --scenario gang`: a job of 2 nodes, one warned, the whole gang relaunched once
             (its nodes' commands and tasks: gang_nodes.py; its proof: gang_proof.py)
up.py        `local up`: the stack with two instances, kept running until Ctrl-C
inject.py    `local inject`: a notice of any kind for an instance, into a running `local up`
shared.py    what they share: the state and log directory, up's and inject's files, the demos' job
replay/      `local replay`: the stack on the clock of real spot traces, beside the simulator

Nothing here is imported at this package's import: a replay's task process (replay/task.py) starts
with only what it needs.
"""
