"""`spotguard local replay`: the local stack on the clock of real spot availability traces, beside the
simulator.

command.py   the command: its arguments and their checks, and the replay beside the simulator's runs
schedule.py  the live run: the stack, the traces' ticks and the jobs' submissions on one scaled clock
report.py    the results: a row per job from its status and task logs, the summary and its proof, the table
world.py     the spot pools that follow the traces
task.py      the job a replay runs (`python -m spotguard_cli.local.replay.task`)
"""
