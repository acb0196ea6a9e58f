"""`bandmaster up --scheduler-replicas N`: N scheduler children with leader election on one shared state
file, the router and the planner given every address, a dead replica started again on its own ports."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services.cli import up
from services.common.settings.errors import ConfigError
from services.launcher.cluster import ClusterConfig, ClusterPorts, planner_spec, router_spec, scheduler_spec
from services.launcher.supervisor import ChildSpec


def _config(*argv: str, **overrides) -> ClusterConfig:
    parser = argparse.ArgumentParser()
    up.add_cluster_arguments(parser)
    return up.cluster_config(parser.parse_args(list(argv)), **overrides)


def _arg(args, flag: str) -> str:
    return args[args.index(flag) + 1]


def test_two_replicas_share_the_state_file_with_leader_election(tmp_path):
    config = _config("--scheduler-replicas", "2", ports=ClusterPorts.fixed())
    first, second = (scheduler_spec(config, "127.0.0.1:1", tmp_path, i) for i in range(2))
    assert (first.name, second.name) == ("scheduler", "scheduler-1")
    for spec in (first, second):
        assert "--leader-election" in spec.args
        assert _arg(spec.args, "--state-path") == str(tmp_path / "scheduler-state.sqlite")
    assert _arg(first.args, "--listen") == "127.0.0.1:50052" and _arg(second.args, "--listen") == "127.0.0.1:50062"
    assert _arg(first.args, "--metrics-port") == "9102" and _arg(second.args, "--metrics-port") == "9112"
    ports = [port for which, port in config.planned_ports() if which.startswith("scheduler")]
    assert sorted(ports) == [9102, 9112, 50052, 50062]


def test_one_replica_is_the_single_scheduler_as_before(tmp_path):
    spec = scheduler_spec(_config(), "127.0.0.1:1", tmp_path)
    assert spec.name == "scheduler" and "--leader-election" not in spec.args
    assert _arg(spec.args, "--state-path") == "none"  # outside `bandmaster up`: in memory


def test_the_router_and_the_planner_are_given_every_replica(tmp_path):
    config = _config("--scheduler-replicas", "2")
    addresses = "127.0.0.1:50052,127.0.0.1:50062"
    assert _arg(router_spec(config, "127.0.0.1:1", addresses).args, "--scheduler-addr") == addresses
    planner = planner_spec(config, "127.0.0.1:1", addresses, "http://m", tmp_path)
    assert _arg(planner.args, "--scheduler") == addresses


@pytest.mark.parametrize("replicas", [0, 6])
def test_a_replica_count_out_of_range_names_the_rule(replicas):
    with pytest.raises(ConfigError) as err:
        _config("--scheduler-replicas", str(replicas))
    assert err.value.field == "scheduler_replicas"


@dataclass
class FakeProcess:
    returncode: int | None = None

    def poll(self):
        return self.returncode


@dataclass
class FakeChild:
    spec: ChildSpec
    process: FakeProcess
    ready: dict = field(default_factory=dict)


class FakeSupervisor:
    def __init__(self, children) -> None:
        self.children = list(children)
        self.started: list[ChildSpec] = []

    def failed(self):
        return [c for c in self.children if c.process.poll() is not None]

    def start(self, spec: ChildSpec):
        self.started.append(spec)
        child = FakeChild(spec, FakeProcess())
        self.children.append(child)
        return child


@dataclass
class FakeCluster:
    supervisor: FakeSupervisor
    schedulers: list
    scheduler: object = None


def test_a_dead_replica_is_started_again_on_its_own_ports_and_other_deaths_still_count(capsys):
    config = _config("--scheduler-replicas", "2")  # --ports auto: the specs say port 0
    spec = scheduler_spec(config, "127.0.0.1:1", Path("/tmp/x"), 1)
    dead = FakeChild(spec, FakeProcess(-9), {"grpc": "127.0.0.1:41000", "metrics_port": 41001})
    alive = FakeChild(scheduler_spec(config, "127.0.0.1:1", Path("/tmp/x"), 0), FakeProcess())
    router = FakeChild(ChildSpec("router", "services.router", []), FakeProcess(1))
    cluster = FakeCluster(FakeSupervisor([alive, dead, router]), [alive, dead], alive)
    restarts: dict[str, float] = {}
    others = up.restart_scheduler_replicas(cluster, config, restarts)
    assert others == [router]  # the router's death still stops the cluster
    (restarted,) = cluster.supervisor.started
    assert _arg(restarted.args, "--listen") == "127.0.0.1:41000" and _arg(restarted.args, "--metrics-port") == "41001"
    assert dead not in cluster.supervisor.children and cluster.schedulers[1].spec is restarted
    assert "starting it again as a standby" in capsys.readouterr().err
    # A single scheduler's death is not hidden.
    single = _config()
    cluster = FakeCluster(FakeSupervisor([dead]), [dead], dead)
    assert up.restart_scheduler_replicas(cluster, single, {}) == [dead]
