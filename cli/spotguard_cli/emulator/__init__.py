"""The emulator: SpotGuard's stack on this machine, against moto, for `spotguard local`, tests and benchmarks.

template.py    template.yaml translated offline with aws-sam-translator
stack.py       `deploy`: the template created in moto's CloudFormation -> `DeployedStack` (not running)
lambdas.py     `FunctionHost` (a handler in this process) and `QueuePoller` (the SQS event source mapping)
gpucluster.py  simulated GPU spot instances, and `GpuScheduler` playing ECS placement (moto has no GPUs)
assembly.py    `assemble`: the one place the parts above are put together
system.py      `LocalSystem`: the assembly running on moto server, tasks as local processes (runner.py)
world.py       `JobsWorld`: the assembly on moto in this process, task events played by the tests
inject.py      EventBridge events of every kind, built from the samples in events/eventbridge
motoserver.py  moto server on a free port of 127.0.0.1
timeline.py    the demo's timeline of what happened and when
"""
