"""The soak's loop on a virtual clock: many jobs through spot availability traces, the whole system in this
process, and what must never happen counted (`spotguard local soak`: local/soak.py; a replay on the virtual
clock, local/replay/virtual.py, runs the same loop over its own pools and jobs).

model.py   the plan, the tasks and jobs it models, the result, and the model's timings
state.py   `SoakState`: what the loop keeps, and its timeline
faults.py  `SoakFaults`: the faults played in the world and at SpotGuard's own AWS calls
world.py   `SoakWorld`: the pools following the traces, the jobs submitted and cancelled, the tasks modelled
counts.py  `SoakCounts`: what must never happen, counted at the end (`Result`)
loop.py    `Soak`: the loop, from one thing due to the next
system.py  `virtual_system`: the whole stack in this process on a virtual clock, for a soak or a replay
"""
