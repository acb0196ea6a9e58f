# syntax=docker/dockerfile:1
# One image for every Bandmaster service (capacity, scheduler, router, planner, batch, simworker): the
# compose file and the Kubernetes manifests pick the service with the command
# `python -m services.<name>`. docs/deploy/compose.md explains the cluster built from it.
#
# Pinned by exact tag so that a rebuild gets the same Python and Debian release; bump it on purpose.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# --- build: resolve and install everything into a self-contained virtualenv -----------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/bandmaster
ENV PATH=/opt/bandmaster/bin:$PATH
WORKDIR /src
# The dependencies first, exactly as requirements-runtime.lock pins them (versions and hashes): this
# layer is reused while only the code changes. Every dependency ships wheels for linux/amd64 and
# linux/arm64; the only compiler this stage uses is for the scheduler core, below.
COPY requirements-runtime.lock ./
RUN pip install --require-hashes -r requirements-runtime.lock
# The scheduler core is compiled (scripts/compile_core.py, docs/scheduler.md "The compiled core"): gcc, and
# mypyc in a throwaway virtualenv pinned by requirements-build.lock, both for this stage only. The runtime
# stage gets the extension modules with the package, and no compiler or mypy.
COPY requirements-build.lock ./
RUN command -v gcc >/dev/null || { apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*; }
RUN python -m venv .build-tools && .build-tools/bin/pip install --require-hashes -r requirements-build.lock
COPY pyproject.toml README.md ./
COPY bandmaster ./bandmaster
COPY services ./services
COPY clients ./clients
COPY scripts/compile_core.py ./scripts/compile_core.py
RUN .build-tools/bin/python scripts/compile_core.py --require
RUN pip install --no-deps . && python -m compileall -q /opt/bandmaster

# --- runtime: the virtualenv alone, run by an unprivileged user -----------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/bandmaster/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 10001 bandmaster \
 && useradd --system --uid 10001 --gid bandmaster --home-dir /var/lib/bandmaster --create-home \
      --shell /usr/sbin/nologin bandmaster
COPY --from=build /opt/bandmaster /opt/bandmaster
# State that must outlive a container (the batch service's registry, the planner's jobs) goes to a volume here.
WORKDIR /var/lib/bandmaster
USER 10001:10001
# capacity, scheduler, router, planner, batch gRPC; router and batch service HTTP; metrics; simworker HTTP.
# Every service listens on loopback by default. A container that listens on 0.0.0.0 for its gRPC or
# /metrics port must authenticate its callers there or say --insecure (BANDMASTER_<SERVICE>_INSECURE=true),
# else it refuses to start (the bind rule, docs/security.md); the compose file and the Kubernetes
# manifests set it.
EXPOSE 50051 50052 50053 50061 50063 8000 8090 9101 9102 9103 9105 9106 30000
# Probes the endpoints named in BANDMASTER_HEALTHCHECK (e.g. "grpc://127.0.0.1:50051"); the compose
# file sets each service's own probe. services/common/serve/healthcheck.py.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-m", "services.common.serve.healthcheck"]
CMD ["python", "-m", "services.router"]
