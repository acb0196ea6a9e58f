"""What runs Bandmaster and plays agent programs through it, shared by the `bandmaster` CLI
(services/cli) and the benchmarks (bench/), which import it and never each other:

* `cluster`, `supervisor`: the local cluster `bandmaster up` starts (simworkers, capacity,
  scheduler, router, planner as child processes) and the supervisor that starts and stops them;
* `workloads`, `player`: the agent programs (the shipped SWE-agent trace, synthetic ones) and the
  closed-loop player (`Runner`) that plays them against an OpenAI-compatible endpoint;
* `simlib`: the offline simulator of the same runs, built from the services' pure cores;
* `probes`, `progress`, `table`, `stats`: looking at a running cluster, a progress bar, text
  tables, percentiles.

It imports the services (their cores, config and generated protobuf stubs) and nothing of
services.cli or bench.
"""

# First, before any module here imports grpc: the services package turns gRPC's fork handlers off,
# and gRPC reads that setting once, at its first import. Whatever forks this process after it has
# used gRPC (a worker pool, a `subprocess` that cannot vfork) could deadlock with the handlers on.
import services  # noqa: E402,F401
