"""What `bandmaster up` passes its children: flags from the command line reach the right child."""

import argparse
import json

from services.cli.cluster import ClusterConfig, router_spec, scheduler_spec, simworker_spec
from services.cli.up import add_cluster_arguments, cluster_config


def _config(*argv: str) -> ClusterConfig:
    parser = argparse.ArgumentParser()
    add_cluster_arguments(parser)
    return cluster_config(parser.parse_args(list(argv)))


def test_router_and_scheduler_extra_flags_come_last_so_they_win():
    config = _config("--router-arg=--seed=7", "--scheduler-arg=--pause-threshold=0.9")
    router = router_spec(config, "127.0.0.1:1", "127.0.0.1:2")
    assert router.args[-1] == "--seed=7" and "--scheduler-addr" in router.args
    assert scheduler_spec(config, "127.0.0.1:1").args[-1] == "--pause-threshold=0.9"


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
