"""`bandmaster up`'s ports and its healthy-worker verdict (the pure parts; its discovery: test_clusters.py)."""

import argparse
import socket

import pytest

from bandmaster.capacity.v1 import capacity_pb2 as cpb
from services.batch.config import SETTINGS as BATCH
from services.capacity.config import SETTINGS as CAPACITY
from services.cli.up import (
    add_cluster_arguments,
    add_port_arguments,
    busy_ports,
    cluster_config,
    cluster_ports,
    fleet_health,
    http_port,
    no_healthy_worker_banner,
)
from services.common.serve.ports import DEFAULT_PORTS
from services.common.settings.errors import ConfigError
from services.launcher.cluster import ClusterConfig, ClusterPorts, capacity_spec, router_spec, simworker_spec
from services.planner.config import SETTINGS as PLANNER
from services.router.config import SETTINGS as ROUTER
from services.scheduler.config import SETTINGS as SCHEDULER
from services.simworker.config import SETTINGS as SIMWORKER


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_cluster_arguments(parser)
    add_port_arguments(parser)
    return parser.parse_args(list(argv))


def _default(settings, name):
    return next(s.default for s in settings if s.name == name)


def test_the_documented_ports_are_the_services_own_defaults():
    for settings, service in (
        (CAPACITY, "capacity"),
        (SCHEDULER, "scheduler"),
        (ROUTER, "router"),
        (PLANNER, "planner"),
    ):
        assert _default(settings, "listen") == f"127.0.0.1:{DEFAULT_PORTS[service]}"
        assert _default(settings, "metrics_port") == DEFAULT_PORTS[f"{service}_metrics"]
    assert _default(ROUTER, "http_port") == DEFAULT_PORTS["router_http"]
    assert _default(BATCH, "listen") == f"127.0.0.1:{DEFAULT_PORTS['batch']}"
    assert _default(BATCH, "metrics_port") == DEFAULT_PORTS["batch_metrics"]
    assert _default(BATCH, "http_listen") == f"127.0.0.1:{DEFAULT_PORTS['batch_http']}"
    assert _default(SIMWORKER, "port") == DEFAULT_PORTS["simworker"]


def test_up_uses_the_fixed_ports_and_each_flag_moves_one():
    ports = cluster_ports(_args())
    assert ports == ClusterPorts.fixed()
    assert (ports.capacity, ports.scheduler, ports.router, ports.planner) == (50051, 50052, 50053, 50061)
    assert cluster_ports(_args("--scheduler-port", "6000")).scheduler == 6000
    assert cluster_config(_args()).http_port == 8000


def test_ports_auto_leaves_every_port_not_given_to_the_system():
    ports = cluster_ports(_args("--ports", "auto", "--router-port", "7001"))
    assert ports.router == 7001
    assert ports.capacity == ports.scheduler == ports.batch_http == ports.first_worker == 0


def test_the_ports_reach_the_children_flags():
    config = ClusterConfig(workers=2, ports=ClusterPorts.fixed())
    capacity = capacity_spec(config, []).args
    assert capacity[capacity.index("--listen") + 1] == "127.0.0.1:50051"
    assert capacity[capacity.index("--metrics-port") + 1] == "9101"
    router = router_spec(config, "127.0.0.1:50051", "127.0.0.1:50052").args
    assert router[router.index("--listen") + 1] == "127.0.0.1:50053"
    assert router[router.index("--http-port") + 1] == "8000"
    assert [simworker_spec(config, i).args[3] for i in range(2)] == ["30000", "30001"]
    # The library default (tests, benchmarks, the demo) stays any free port.
    assert capacity_spec(ClusterConfig(), []).args[1] == "127.0.0.1:0"


def test_a_port_given_twice_is_refused_naming_both():
    with pytest.raises(ConfigError, match="each port is used once"):
        ClusterConfig(workers=2, ports=ClusterPorts(capacity=40000, first_worker=39999))
    with pytest.raises(ConfigError, match="port <= 65535"):
        ClusterConfig(workers=3, ports=ClusterPorts(first_worker=65534), http_port=0)


def test_busy_ports_names_the_port_and_the_up_flag_that_moves_it():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        config = ClusterConfig(
            workers=1, http_port=0, scheduler=False, ports=ClusterPorts(scheduler=port, router_metrics=port)
        )
        [(taken, line)] = busy_ports(config)  # the scheduler is off: its port is not wanted
        assert taken == port
        assert (
            line == f"port {port} (router /metrics) is already in use; choose another with --router-metrics-port "
            "(or --ports auto)"
        )


def _worker(url, health, reason="", failures=0):
    return cpb.Worker(
        worker_id=url.rsplit("/", 1)[-1], url=url, health=health, excluded_reason=reason, consecutive_failures=failures
    )


def test_fleet_health_carries_the_degraded_warning_naming_each_worker_and_the_flag():
    snapshot = cpb.WorkersSnapshot(workers=[_worker("http://a:1", cpb.WORKER_HEALTH_HEALTHY)])
    assert fleet_health(snapshot).degraded == ""
    snapshot.workers[0].card.degraded.append(cpb.DEGRADATION_CACHE_REPORT_OFF)
    degraded = fleet_health(snapshot).degraded
    assert "DEGRADED: 1 of 1 workers" in degraded
    assert "http://a:1: cache reports off; restart it with --enable-cache-report" in degraded


def test_fleet_health_names_each_unhealthy_worker_and_why():
    snapshot = cpb.WorkersSnapshot(
        workers=[
            _worker("http://a:1", cpb.WORKER_HEALTH_HEALTHY),
            _worker("http://b:2", cpb.WORKER_HEALTH_UNHEALTHY, "unhealthy: polls failing (last: connection)"),
            _worker("http://c:3", cpb.WORKER_HEALTH_PENDING, failures=2),
        ]
    )
    health = fleet_health(snapshot)
    assert (health.healthy, health.total, health.pending, health.settled) == (1, 3, 1, False)
    # One healthy and the others found unhealthy: nothing more to wait for; none healthy: wait on.
    assert fleet_health(cpb.WorkersSnapshot(workers=snapshot.workers[:2])).settled
    assert not fleet_health(cpb.WorkersSnapshot(workers=snapshot.workers[1:2])).settled
    assert not fleet_health(cpb.WorkersSnapshot()).settled
    assert health.problems == (
        ("http://b:2", "unhealthy: polls failing (last: connection)"),
        ("http://c:3", "pending: 2 failed polls"),
    )
    banner = no_healthy_worker_banner(fleet_health(cpb.WorkersSnapshot(workers=snapshot.workers[1:])), 12.4)
    assert "NO HEALTHY WORKER after 12 s" in banner and "http://b:2: unhealthy" in banner
    assert "the capacity service knows no worker" in no_healthy_worker_banner(fleet_health(cpb.WorkersSnapshot()), 1)


def test_the_batch_service_ports_clash_with_no_scheduler_replica():
    """Scheduler replica i listens on the scheduler ports + 10 i (50062 for the second): the batch service's
    fixed ports are none of them, so `--scheduler-replicas 5` with the planner on still starts."""
    config = ClusterConfig(planner=True, scheduler_replicas=5, ports=ClusterPorts.fixed())  # validates: no clash
    planned = dict(config.planned_ports())
    assert planned["batch"] == DEFAULT_PORTS["batch"] and planned["batch_http"] == DEFAULT_PORTS["batch_http"]


def test_port_base_puts_every_port_in_one_block_and_a_flag_still_moves_one():
    args = _args("--port-base", "41000", "--router-metrics-port", "39000")
    ports = cluster_ports(args)
    assert (ports.capacity, ports.scheduler, ports.router, ports.planner) == (41001, 41002, 41003, 41004)
    assert (ports.batch, ports.batch_http, ports.capacity_metrics, ports.scheduler_metrics) == (
        41005,
        41006,
        41007,
        41008,
    )
    assert (ports.router_metrics, ports.planner_metrics, ports.batch_metrics) == (39000, 41010, 41011)
    assert ports.first_worker == 41050 and http_port(args) == 41000
    assert http_port(_args("--port-base", "41000", "--http-port", "8001")) == 8001
    # Five scheduler replicas (+10 i each) and three workers fit the block without a clash.
    config = ClusterConfig(workers=3, planner=True, scheduler_replicas=5, ports=ports, http_port=41000)
    planned = sorted(port for _, port in config.planned_ports() if port != 39000)
    assert planned[0] == 41000 and planned[-1] == 41052 and len(planned) == len(set(planned))


def test_port_base_is_refused_with_ports_auto_or_out_of_range():
    with pytest.raises(ConfigError, match="give --port-base or --ports auto, not both"):
        cluster_ports(_args("--port-base", "41000", "--ports", "auto"))
    with pytest.raises(ConfigError, match="port_base <= 65485"):
        cluster_ports(_args("--port-base", "65500"))
