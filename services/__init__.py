"""Bandmaster services: capacity, scheduler, router, planner and the simulated worker."""

import os as _os

# Our processes use gRPC and also spawn children (`bandmaster up`, the benchmarks, the tests).
# With gRPC's fork support on, grpcio >= 1.81 restarts its poller in the forked child before
# `exec`, and the child can abort with "epoll_wait: Bad file descriptor" (grpc/grpc#43055): a
# router that "exited with code -6 before serving". Nothing here uses gRPC across a fork, so the
# fork handlers are turned off before gRPC starts, unless the environment says otherwise.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
