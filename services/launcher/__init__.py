"""The local cluster `bandmaster up` starts, shared by the CLI and the benchmarks that start a stack:

* `cluster`, `supervisor`: the simworkers, capacity, scheduler, router and planner as child processes, and the
  supervisor that starts, health-checks and stops them;
* `probes`: looking at a running cluster (capacity and scheduler state);
* `table`: the text tables the CLI prints.

Product, installed with the CLI; it imports services.common's process plumbing and nothing of a service's shell
(pyproject contract (c)). The agent-program player and its workloads are in clients/.
"""
