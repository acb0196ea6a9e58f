"""Development tools, run from a checkout and not installed (pyproject installs services, clients, bandmaster):

* `simlib`: the offline simulator of agent-program runs, built from the services' pure cores;
* `peers`: the published schedulers the simulator and the benchmarks compare against.

The benchmarks (bench/) and `bandmaster demo`'s prediction (when run from a checkout) import it. The local cluster
launcher is services/launcher; the player and its workloads are clients/player.py and clients/workloads.
"""

# First, before any module here imports grpc: the services package turns gRPC's fork handlers off,
# and gRPC reads that setting once, at its first import. Whatever forks this process after it has
# used gRPC (a worker pool, a `subprocess` that cannot vfork) could deadlock with the handlers on.
import services  # noqa: E402,F401
