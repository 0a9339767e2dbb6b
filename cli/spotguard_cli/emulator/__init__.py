"""The emulator: SpotGuard's stack on this machine, against moto, for `spotguard local`, tests and benchmarks.

template.py      template.yaml translated offline with aws-sam-translator
stack.py         `deploy`: the template created in moto's CloudFormation -> `DeployedStack` (not running)
lambdas.py       `FunctionHost` (a handler in this process) and `QueuePoller` (the SQS event source mapping)
scaling.py       `Scaling`: how many invocations the SQS event source mapping runs at once
gpucluster.py    simulated GPU spot instances registered in the cluster (moto has no GPUs)
gpuscheduler.py  `GpuScheduler` playing ECS placement on them
assembly.py      `assemble`: the one place the parts above are put together
system.py        `LocalSystem`: the assembly running on moto server, tasks as local processes (runner.py)
scaledclock.py   `ScaledClock`: the local system's time, faster than the wall clock
pools.py         `SystemPools`: `LocalSystem`'s pools, their instances, shortages and boot model
world.py         `JobsWorld`: the assembly on moto in this process, task events played by the tests
soak/            `Soak`: many jobs on a virtual clock, the whole stack in this process (`local soak`, replay)
faults.py        faults injected into SpotGuard's AWS calls (clockpatch.py: time for the libraries)
inject.py        EventBridge events of every kind, built from the samples in events/eventbridge
motoserver.py    moto server on a free port of 127.0.0.1
timeline.py      the demo's timeline of what happened and when
"""
