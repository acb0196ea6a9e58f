"""What `bandmaster up` passes its children: flags from the command line reach the right child."""

import argparse
import json

import pytest

from services.cli.up import add_cluster_arguments, cluster_config
from services.common.settings.errors import ConfigError
from services.launcher.cluster import (
    ClusterConfig,
    batch_spec,
    local_worker_args,
    planner_spec,
    router_spec,
    scheduler_spec,
    simworker_spec,
)


def _config(*argv: str) -> ClusterConfig:
    parser = argparse.ArgumentParser()
    add_cluster_arguments(parser)
    return cluster_config(parser.parse_args(list(argv)))


def test_router_and_scheduler_extra_flags_come_last_so_they_win():
    config = _config("--router-arg=--seed=7", "--scheduler-arg=--pause-threshold=0.9")
    router = router_spec(config, "127.0.0.1:1", "127.0.0.1:2")
    assert router.args[-1] == "--seed=7" and "--scheduler-addr" in router.args
    assert scheduler_spec(config, "127.0.0.1:1").args[-1] == "--pause-threshold=0.9"


def test_simulated_workers_report_cached_tokens_unless_told_not_to():
    assert "--enable-cache-report" in simworker_spec(_config(), 0).args
    assert "--enable-cache-report" not in simworker_spec(_config("--no-worker-cache-report"), 0).args


def test_time_constants_are_divided_by_the_speedup():
    args = scheduler_spec(_config("--speedup", "20"), "127.0.0.1:1").args
    assert args[args.index("--resume-aging-seconds") + 1] == "15"
    assert args[args.index("--resume-timeout-seconds") + 1] == "90"


def test_without_scheduler_the_router_routes_alone():
    router = router_spec(_config("--no-scheduler"), "127.0.0.1:1", None)
    assert "--no-scheduler" in router.args and "--scheduler-addr" not in router.args


def test_a_tokenizer_reaches_router_and_workers_and_turns_kv_events_on(tmp_path):
    config = _config("--tokenizer", str(tmp_path))
    worker = simworker_spec(config, 0).args
    assert worker[worker.index("--tokenizer-path") + 1] == str(tmp_path)
    assert json.loads(worker[worker.index("--kv-events-config") + 1])["publisher"] == "zmq"
    router = router_spec(config, "127.0.0.1:1", "127.0.0.1:2").args
    assert router[router.index("--tokenizer") + 1] == str(tmp_path)
    assert "--no-use-kv-events" not in scheduler_spec(config, "127.0.0.1:1").args
    alone = router_spec(config, "127.0.0.1:1", None).args
    assert "--use-kv-events" in alone and "--no-use-kv-events" not in alone


def test_without_a_tokenizer_routing_stays_on_text_without_kv_events():
    config = _config()
    assert "--no-use-kv-events" in scheduler_spec(config, "127.0.0.1:1").args
    assert "--no-use-kv-events" in router_spec(config, "127.0.0.1:1", None).args
    assert "--tokenizer" not in router_spec(config, "127.0.0.1:1", "127.0.0.1:2").args
    worker = simworker_spec(config, 0).args
    assert "--tokenizer-path" not in worker and "--kv-events-config" not in worker


def test_up_keeps_the_scheduler_state_in_its_state_dir_and_others_keep_it_in_memory(tmp_path):
    args = scheduler_spec(_config(), "127.0.0.1:1", tmp_path).args
    assert args[args.index("--state-path") + 1] == "none"  # demo and benchmarks: a fresh table every run
    durable = ClusterConfig(scheduler_state=True)
    args = scheduler_spec(durable, "127.0.0.1:1", tmp_path).args
    assert args[args.index("--state-path") + 1] == str(tmp_path / "scheduler-state.sqlite")
    # A --scheduler-arg still wins (it comes last).
    override = ClusterConfig(scheduler_state=True, scheduler_args=("--state-path=/elsewhere.sqlite",))
    assert scheduler_spec(override, "127.0.0.1:1", tmp_path).args[-1] == "--state-path=/elsewhere.sqlite"


def _flag(args, name):
    return args[args.index(name) + 1]


def test_the_planner_follows_the_router_and_owns_a_fixed_virtual_fleet_by_default(tmp_path):
    config = ClusterConfig(workers=3, worker_speedup=10, planner=True)
    spec = planner_spec(config, "127.0.0.1:1", "127.0.0.1:2", "http://127.0.0.1:9", tmp_path)
    args = spec.args
    assert spec.name == "planner" and spec.module == "services.planner"
    assert _flag(args, "--listen") == "127.0.0.1:0" and _flag(args, "--metrics-port") == "0"
    assert _flag(args, "--registry-path") == str(tmp_path / "planner.sqlite3")
    assert _flag(args, "--capacity") == "127.0.0.1:1" and _flag(args, "--scheduler") == "127.0.0.1:2"
    assert "--dispatch-url" not in args and "--http-listen" not in args  # control only: no Batch API, no sends
    assert _flag(args, "--router-metrics-url") == "http://127.0.0.1:9"
    assert _flag(args, "--connector") == "virtual" and _flag(args, "--virtual-initial-replicas") == "3"
    assert _flag(args, "--min-replicas") == "3" and _flag(args, "--max-replicas") == "3"
    assert _flag(args, "--tick-interval-seconds") == "0.5"
    assert (
        _flag(router_spec(config, "127.0.0.1:1", "127.0.0.1:2", "http://127.0.0.1:8091").args, "--batch-url")
        == "http://127.0.0.1:8091"
    )
    assert "--batch-url" not in router_spec(config, "127.0.0.1:1", "127.0.0.1:2").args
    batch = batch_spec(config, "127.0.0.1:5", "http://127.0.0.1:8000", 8091, tmp_path)
    assert batch.name == "batch" and batch.module == "services.batch"
    assert _flag(batch.args, "--http-listen") == "127.0.0.1:8091" and _flag(batch.args, "--planner") == "127.0.0.1:5"
    assert _flag(batch.args, "--dispatch-url") == "http://127.0.0.1:8000"
    assert _flag(batch.args, "--registry-path") == str(tmp_path / "batch.sqlite3")


def test_the_local_connector_starts_workers_like_up_does(tmp_path):
    config = _config("--workers", "2", "--speedup", "20", "--worker-kv-tokens", "8192")
    config = ClusterConfig(
        **{
            **config.__dict__,
            "planner": True,
            "planner_connector": "local",
            "planner_args": ("--safe-rps-per-replica=9",),
        }
    )
    args = planner_spec(config, "127.0.0.1:1", None, "http://r:2", tmp_path).args
    assert _flag(args, "--connector") == "local" and "--virtual-initial-replicas" not in args
    assert _flag(args, "--min-replicas") == "2" and _flag(args, "--max-replicas") == "4"
    assert "--scheduler" not in args and args[-1] == "--safe-rps-per-replica=9"
    worker = [a.split("=", 1)[1] for a in args if a.startswith("--local-worker-arg=")]
    assert _flag(worker, "--max-total-tokens") == "8192" and _flag(worker, "--speedup") == "20.0"
    assert "--port" not in worker and "--seed" not in worker
    assert worker == local_worker_args(config)


def test_the_planner_config_is_validated():
    with pytest.raises(ConfigError, match="planner_connector"):
        ClusterConfig(planner=True, planner_connector="kubernetes")
    with pytest.raises(ConfigError, match="planner_connector"):
        ClusterConfig(planner=True, planner_connector="local", worker_urls=("http://127.0.0.1:1",))
    with pytest.raises(ConfigError, match="planner_max_replicas"):
        ClusterConfig(workers=3, planner_max_replicas=2)


@pytest.mark.parametrize("host", [0, 65_536])
def test_the_simulated_engines_are_the_ones_bandmaster_up_starts(host):
    """SimScenario.engine_config mirrors simworker_spec: a simworker started with the flags `bandmaster
    up` gives it builds the same engine, priority scheduling included (without it the scheduler's
    priorities would order nothing, in the simulator or in the demo)."""
    from harness.simlib import SimScenario
    from services.simworker.config import load_config
    from services.simworker.profiles import load_profile
    from services.simworker.server import engine_config

    config = _config("--worker-kv-tokens", "16384", "--worker-host-kv-tokens", str(host))
    worker = load_config(simworker_spec(config, 0).args, {})
    scenario = SimScenario(worker_kv_tokens=16_384, worker_host_kv_tokens=host)
    live = engine_config(worker, load_profile(worker.timing_profile).kv_bytes_per_token)
    assert scenario.engine_config(0) == live
    assert live.enable_priority_scheduling


def test_router_processes_reach_the_router_and_one_is_the_default():
    assert "--processes" not in router_spec(_config(), "127.0.0.1:1", "127.0.0.1:2").args
    args = router_spec(_config("--router-processes", "2"), "127.0.0.1:1", "127.0.0.1:2").args
    assert args[args.index("--processes") + 1] == "2"
    assert "--router-replica-sync" in args  # the processes act as one router: they share their load
    assert "--router-replica-sync" not in router_spec(_config(), "127.0.0.1:1", "127.0.0.1:2").args
    with pytest.raises(ConfigError) as err:
        _config("--router-processes", "0")
    assert err.value.field == "router_processes"


def test_trace_dir_gives_every_service_child_a_span_file(tmp_path):
    from services.launcher.supervisor import ChildSpec, Supervisor

    assert _config().trace is False
    bare = _config("--trace-dir", "--state-dir", str(tmp_path))
    assert bare.trace and bare.trace_dir is None  # start_cluster puts it in <state dir>/traces
    named = _config("--trace-dir", str(tmp_path / "t"), "--trace-background")
    assert named.trace and named.trace_dir == tmp_path / "t" and named.trace_background
    supervisor = Supervisor(tmp_path)
    router = ChildSpec("router", "services.router", [])
    assert supervisor.trace_args(router) == []
    supervisor.trace_dir = tmp_path / "t"
    assert supervisor.trace_args(router) == ["--trace-file", str(tmp_path / "t" / "router.jsonl")]
    assert supervisor.trace_args(ChildSpec("proxy", "bench.peer_proxy", [])) == []  # not a service: no such flag
    supervisor.trace_background = True
    assert supervisor.trace_args(router)[-1] == "--trace-background"
