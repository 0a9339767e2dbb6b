"""The capacity simulator: capacity policies replayed on spot availability traces, and the omniscient bound.

traces.py      the trace format (`load_trace`, `Trace`, `TraceError`)
policy_run.py  one run of a policy over the traces, tick by tick (`simulate`, `Job`, `Prices`, `RunResult`)
omniscient.py  the cheapest run that knows the whole trace, the bound policies are measured against

`spotguard simulate` (simulate.py, beside main.py) and bench/capacity.py run it.
"""

from spotguard_cli.simulator.omniscient import omniscient
from spotguard_cli.simulator.policy_run import Job, Prices, RunResult, check_job, simulate
from spotguard_cli.simulator.traces import Trace, TraceError, load_trace

__all__ = [
    "Job",
    "Prices",
    "RunResult",
    "Trace",
    "TraceError",
    "check_job",
    "load_trace",
    "omniscient",
    "simulate",
]
