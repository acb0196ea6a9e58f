"""docker-compose.yml and the Dockerfile, checked without a container engine.

* The file, as Compose sees it (interpolated with the defaults and with the real-worker variables), is
  valid against the vendored Compose Specification schema.
* Every Bandmaster service's command and environment load through that service's own `load_config`
  (a renamed or removed flag fails here), and every variable it sets is one the service reads.
* Ports agree everywhere: what each service listens on (from its parsed config), what it exposes and
  publishes, what its healthcheck probes, what other services and Prometheus address it on.
* The third-party configs (collector, Prometheus, Grafana provisioning) are consistent with the file.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Any, Mapping

import jsonschema
import pytest
import yaml

from services.common.auth.security import CONTROL_TOKEN_ENV, DATA_TOKEN_ENV
from services.common.settings.config import Setting
from services.common.settings.errors import ConfigError
from services.planner.adapters.profile import load_engine_profile
from services.planner.server import build_settings
from tests.deploy import compose_harness as ch
from tests.deploy.image_refs import image_is_pinned, package_version

ROOT = ch.ROOT
SCHEMA = ROOT / "deploy" / "compose" / "schema" / "compose-spec.json"
PROMETHEUS = ROOT / "deploy" / "compose" / "prometheus.yml"
COLLECTOR = ROOT / "deploy" / "compose" / "otel-collector.yaml"
GRAFANA = ROOT / "deploy" / "compose" / "grafana" / "provisioning"
# Written by other work (the dashboard and the alert rules); mounted here, checked when present.
EXTERNAL_MOUNTS = {"deploy/grafana/dashboards", "deploy/prometheus/alerts.yml"}
REAL_WORKERS = {
    "BANDMASTER_SIMWORKERS": "0",
    "BANDMASTER_WORKER_URLS": "http://gpu-a:30000,http://gpu-b:30000",
    "BANDMASTER_WORKER_COUNT": "2",
}
# Variables a service reads besides its own settings: the token variables of services/common/auth/security.py,
# and the OpenTelemetry SDK's standard ones.
SHARED_ENV = {CONTROL_TOKEN_ENV, DATA_TOKEN_ENV}


def compose(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    return ch.load_compose(ch.COMPOSE_FILE, env)


def bandmaster_services(doc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {name: s for name, s in doc["services"].items() if ch.is_bandmaster(s)}


def service_module(service: Mapping[str, Any]) -> str:
    argv = ch.command_argv(service)
    assert argv[:2] == ["python", "-m"] and argv[2].startswith("services."), argv
    return argv[2]


def load_service_config(service: Mapping[str, Any]) -> Any:
    """The service's config exactly as its entry point would build it from this command and environment."""
    config_module = importlib.import_module(service_module(service) + ".config")
    return config_module.load_config(ch.command_argv(service)[3:], ch.environment(service))


def settings_of(service: Mapping[str, Any]) -> list[Setting]:
    return list(importlib.import_module(service_module(service) + ".config").SETTINGS)


def listen_ports(name: str, service: Mapping[str, Any]) -> dict[str, int]:
    """{role: port} a Bandmaster service binds, from its parsed config."""
    config = load_service_config(service)
    module = service_module(service)
    if module == "services.simworker":
        return {"http": config.port, "metrics": config.port}
    ports = {"grpc": int(config.listen.rpartition(":")[2]), "metrics": config.metrics_port}
    if module == "services.router":
        ports["http"] = config.http_port
    if module == "services.batch":
        ports["http"] = int(config.http_listen.rpartition(":")[2])
    return ports


def container_ports(service: Mapping[str, Any]) -> set[int]:
    """Container-side ports the service declares (`expose` and the target of each `ports` entry)."""
    out = {int(str(p).split("/")[0]) for p in service.get("expose") or []}
    for entry in service.get("ports") or []:
        out.add(int(str(entry).split("/")[0].rsplit(":", 1)[-1]))
    return out


def host_port_refs(value: str, names: set[str]) -> list[tuple[str, int]]:
    """('capacity', 50051) for each 'capacity:50051' (alone or in a URL) naming a compose service."""
    return [
        (m.group(1), int(m.group(2)))
        for m in re.finditer(r"(?<![\w.-])([a-z0-9][\w.-]*):(\d+)", value)
        if m.group(1) in names
    ]


# --- the schema ------------------------------------------------------------------------------------


def validator() -> jsonschema.protocols.Validator:
    """The schema declares draft 2019-09 (by a URL spelling jsonschema does not recognise). Durations
    are Compose's ('10s'), not the ISO 8601 the draft's `duration` format means, so formats are not
    checked; the test below asserts the duration fields Compose parses."""
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft201909Validator.check_schema(schema)
    return jsonschema.Draft201909Validator(schema)


@pytest.mark.parametrize("env", [{}, REAL_WORKERS], ids=["simulated-workers", "real-workers"])
def test_compose_file_is_valid_against_the_compose_specification(env):
    errors = sorted(validator().iter_errors(compose(env)), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_durations_are_compose_durations():
    for name, service in compose()["services"].items():
        fields = {
            k: v for k, v in (service.get("healthcheck") or {}).items() if k in ("interval", "timeout", "start_period")
        }
        if "stop_grace_period" in service:
            fields["stop_grace_period"] = service["stop_grace_period"]
        for key, value in fields.items():
            assert re.fullmatch(r"(\d+(\.\d+)?(h|m|s|ms|us))+", value), f"{name}.{key}: {value!r}"


def test_the_schema_catches_a_mistake():
    doc = compose()
    doc["services"]["router-1"]["helthcheck"] = doc["services"]["router-1"].pop("healthcheck")
    assert list(validator().iter_errors(doc)), "a misspelt service key must fail validation"


def test_vendored_schema_keeps_its_licence():
    folder = SCHEMA.parent
    assert "Apache License" in (folder / "LICENSE").read_text()
    assert "Compose Specification" in (folder / "NOTICE").read_text()


def test_interpolation_follows_compose_rules():
    env = {"SET": "x", "EMPTY": ""}
    assert ch.interpolate_string("${SET:-d} ${UNSET:-d} ${EMPTY:-d} ${EMPTY-d} $SET $$SET", env) == "x d d  x $SET"
    with pytest.raises(ch.InterpolationError):
        ch.interpolate_string("${UNSET:?needed}", env)


# --- our services against their own config parsers -------------------------------------------------


@pytest.mark.parametrize("env", [{}, REAL_WORKERS], ids=["simulated-workers", "real-workers"])
def test_every_bandmaster_service_config_loads(env):
    services = bandmaster_services(compose(env))
    assert {service_module(s) for s in services.values()} == {
        "services.capacity",
        "services.scheduler",
        "services.router",
        "services.planner",
        "services.batch",
        "services.simworker",
    }
    for service in services.values():
        load_service_config(service)  # raises ConfigError naming the flag or value


def test_every_variable_is_one_the_service_reads():
    for name, service in bandmaster_services(compose()).items():
        known = {s.env for s in settings_of(service) if s.env} | SHARED_ENV
        unknown = [k for k in ch.environment(service) if k not in known and not k.startswith("OTEL_")]
        assert not unknown, f"{name} sets variables its service does not read: {unknown}"


def test_services_listen_on_all_interfaces():
    for name, service in bandmaster_services(compose()).items():
        config = load_service_config(service)
        hosts = [config.host] if service_module(service) == "services.simworker" else [config.listen]
        if service_module(service) == "services.batch":
            hosts.append(config.http_listen)
        for host in hosts:
            assert host.startswith("0.0.0.0"), f"{name} binds {host}: other containers could not reach it"


def test_the_documented_default_ports():
    doc = compose()
    expected = {
        "capacity": {"grpc": 50051, "metrics": 9101},
        "scheduler": {"grpc": 50052, "metrics": 9102},
        "scheduler-2": {"grpc": 50052, "metrics": 9102},
        "router-1": {"grpc": 50053, "metrics": 9103, "http": 8000},
        "router-2": {"grpc": 50053, "metrics": 9103, "http": 8000},
        "planner": {"grpc": 50061, "metrics": 9105},
        "batch": {"grpc": 50063, "metrics": 9106, "http": 8090},
        "simworker-1": {"http": 30000, "metrics": 30000},
        "simworker-2": {"http": 30000, "metrics": 30000},
    }
    assert {n: listen_ports(n, s) for n, s in bandmaster_services(doc).items()} == expected


def test_declared_ports_match_what_each_service_binds():
    for name, service in bandmaster_services(compose()).items():
        bound = set(listen_ports(name, service).values())
        declared = container_ports(service)
        assert declared <= bound, f"{name} exposes or publishes {declared - bound}, which it does not bind"
        metrics = listen_ports(name, service)["metrics"]
        assert metrics in declared, f"{name}: metrics port {metrics} is neither exposed nor published"


def test_published_host_ports_are_unique_and_loopback_only():
    seen: dict[str, str] = {}
    for name, service in compose()["services"].items():
        for entry in service.get("ports") or []:
            host_ip, host_port, _ = str(entry).split(":")
            assert host_ip == "127.0.0.1", f"{name} publishes {entry} beyond this machine"
            assert host_port not in seen, f"host port {host_port} published by {seen.get(host_port)} and {name}"
            seen[host_port] = name


def test_healthchecks_probe_the_service_own_ports():
    for name, service in bandmaster_services(compose()).items():
        argv = ch.healthcheck_argv(service)
        assert argv and argv[:3] == ch.HEALTHCHECK_MODULE, f"{name}: healthcheck {argv}"
        ports = listen_ports(name, service)
        for target in argv[3:]:
            from services.common.serve.healthcheck import parse_target

            kind, where = parse_target(target)
            port = int(re.search(r":(\d+)", where.split("//")[-1]).group(1))
            assert "127.0.0.1" in target, f"{name}: {target} must probe the container itself"
            role = "grpc" if kind == "grpc" else "http"
            assert port == ports[role], f"{name}: healthcheck {target} but {role} listens on {ports[role]}"


def test_references_between_services_name_ports_they_listen_on():
    doc = compose()
    names = set(doc["services"])
    listening = {n: set(listen_ports(n, s).values()) for n, s in bandmaster_services(doc).items()}
    for name, service in doc["services"].items():
        listening.setdefault(name, container_ports(service))
    for name, service in bandmaster_services(doc).items():
        for value in [*ch.environment(service).values(), *ch.command_argv(service)]:
            for target, port in host_port_refs(value, names):
                assert port in listening[target], f"{name} reaches {target}:{port}; it listens on {listening[target]}"


def test_stop_grace_outlasts_each_service_own_shutdown_grace():
    for name, service in bandmaster_services(compose()).items():
        config = load_service_config(service)
        own = getattr(config, "shutdown_grace_seconds", 0.0)
        compose_grace = ch.duration_seconds(service.get("stop_grace_period"), 10.0)  # Compose's default is 10s
        assert compose_grace > own, f"{name}: Docker kills at {compose_grace:g}s, before its {own:g}s drain ends"


def test_dependencies_wait_for_health_and_exist():
    doc = compose()
    for name, service in doc["services"].items():
        for dep in ch.healthy_dependencies(service):
            assert dep in doc["services"], f"{name} depends on unknown {dep}"
            assert ch.healthcheck_argv(doc["services"][dep]), f"{name} waits for {dep} to be healthy: it has no check"


def test_real_workers_replace_the_simulated_ones():
    doc = compose(REAL_WORKERS)
    assert [n for n, s in doc["services"].items() if n.startswith("simworker") and ch.replicas(s) > 0] == []
    config = load_service_config(doc["services"]["capacity"])
    assert [w.url for w in config.workers] == ["http://gpu-a:30000", "http://gpu-b:30000"]
    default = load_service_config(compose()["services"]["capacity"])
    assert [w.url for w in default.workers] == ["http://simworker-1:30000", "http://simworker-2:30000"]


def test_planner_leases_live_in_redis_and_both_registries_on_volumes():
    doc = compose()
    planner = doc["services"]["planner"]
    config = load_service_config(planner)
    assert config.lease_store == "redis" and config.redis_url.startswith("redis://redis:")
    for name in ("planner", "batch"):
        service = doc["services"][name]
        path = load_service_config(service).registry_path
        mounts = ch.named_volume_mounts(service, doc)
        assert any(path.startswith(target + "/") for target in mounts), (name, path, mounts)


def test_the_planner_is_control_only_and_the_batch_service_follows_it():
    """The planner has no data-plane settings (no token reaches it); the batch service takes its lease from the
    planner, sends through a router and is what the routers forward the Batch API to."""
    doc = compose()
    planner_env = ch.environment(doc["services"]["planner"])
    assert "BANDMASTER_DATA_TOKEN" not in planner_env and not any("DISPATCH" in k for k in planner_env)
    batch = load_service_config(doc["services"]["batch"])
    assert batch.planner == "planner:50061" and batch.dispatch_url == "http://router-1:8000"
    for router in ("router-1", "router-2"):
        assert load_service_config(doc["services"][router]).batch_url == "http://batch:8090"


# --- the Dockerfile ----------------------------------------------------------------------------------


def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def test_dockerfile_is_multi_stage_pinned_and_unprivileged():
    text = dockerfile()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11\.\d+-slim-bookworm$", text, re.M), "base image not pinned"
    stages = re.findall(r"^FROM (\S+) AS (\w+)$", text, re.M)
    assert [s for _, s in stages] == ["build", "runtime"] and all(i == "${PYTHON_IMAGE}" for i, _ in stages)
    assert "COPY --from=build" in text
    user = re.findall(r"^USER (\S+)$", text, re.M)
    assert user and user[-1].split(":")[0] not in ("0", "root"), "the runtime stage must not run as root"
    assert re.search(r"^HEALTHCHECK .*\n?.*services\.common\.serve\.healthcheck", text, re.M)


def test_every_bandmaster_service_builds_this_dockerfile():
    for name, service in bandmaster_services(compose()).items():
        build = service["build"]
        assert build["context"] == "." and build["dockerfile"] == "Dockerfile", name
        assert service.get("init") is True, f"{name}: init reaps children and forwards signals"


# --- third-party configuration ----------------------------------------------------------------------


def bind_mounts() -> list[tuple[str, str, str]]:
    out = []
    for name, service in compose()["services"].items():
        for entry in service.get("volumes") or []:
            source, target = str(entry).split(":")[:2]
            if source.startswith("./"):
                out.append((name, source[2:], target))
    return out


def test_our_mounted_configs_exist():
    for name, source, _ in bind_mounts():
        if source not in EXTERNAL_MOUNTS:
            assert (ROOT / source).exists(), f"{name} mounts ./{source}, which does not exist"


@pytest.mark.parametrize("source", sorted(EXTERNAL_MOUNTS))
def test_mounted_dashboard_and_alert_rules(source):
    path = ROOT / source
    assert path.exists(), f"compose mounts ./{source}, which does not exist"
    if path.suffix == ".yml":
        rules = yaml.safe_load(path.read_text())
        assert rules.get("groups"), f"{source} has no rule groups"
    else:
        assert list(path.glob("*.json")), f"{source} holds no dashboard JSON"


def prometheus_targets() -> dict[str, list[str]]:
    config = yaml.safe_load(PROMETHEUS.read_text())
    return {
        job["job_name"]: [t for sc in job.get("static_configs", []) for t in sc["targets"]]
        for job in config["scrape_configs"]
    }


def test_prometheus_scrapes_every_bandmaster_metrics_port():
    targets = {t for ts in prometheus_targets().values() for t in ts}
    for name, service in bandmaster_services(compose()).items():
        wanted = f"{name}:{listen_ports(name, service)['metrics']}"
        assert wanted in targets, f"Prometheus does not scrape {wanted}"


def test_prometheus_rule_files_match_the_alerts_mount():
    config = yaml.safe_load(PROMETHEUS.read_text())
    mounted = [t for n, s, t in bind_mounts() if n == "prometheus" and s == "deploy/prometheus/alerts.yml"]
    assert mounted and any(Path(mounted[0]).match(glob) for glob in config["rule_files"]), (mounted, config)


def test_collector_pipeline_reaches_jaeger_and_services_reach_the_collector():
    config = yaml.safe_load(COLLECTOR.read_text())
    traces = config["service"]["pipelines"]["traces"]
    for kind in ("receivers", "processors", "exporters"):
        for component in traces[kind]:
            assert component in config[kind], f"pipeline uses undefined {kind[:-1]} {component}"
    grpc_endpoint = config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert grpc_endpoint.startswith("0.0.0.0:")
    exporter = config["exporters"][traces["exporters"][0]]["endpoint"]
    doc = compose()
    assert exporter.split(":")[0] in doc["services"], exporter
    for name, service in bandmaster_services(doc).items():
        endpoint = ch.environment(service).get("OTEL_EXPORTER_OTLP_ENDPOINT")
        assert endpoint == f"http://otel-collector:{grpc_endpoint.split(':')[1]}", f"{name}: {endpoint}"


def test_grafana_provisioning_matches_the_mounts():
    datasources = yaml.safe_load((GRAFANA / "datasources" / "datasources.yaml").read_text())["datasources"]
    by_type = {d["type"]: d for d in datasources}
    assert by_type["prometheus"]["url"] == "http://prometheus:9090" and by_type["prometheus"]["uid"] == "prometheus"
    assert by_type["jaeger"]["url"] == "http://jaeger:16686"
    providers = yaml.safe_load((GRAFANA / "dashboards" / "dashboards.yaml").read_text())["providers"]
    targets = {t for n, s, t in bind_mounts() if n == "grafana"}
    assert {p["options"]["path"] for p in providers} <= targets
    assert "/etc/grafana/provisioning" in targets


@pytest.mark.parametrize("env", [{}, REAL_WORKERS], ids=["simulated-workers", "real-workers"])
def test_every_image_is_pinned_and_ours_carries_the_package_version(env):
    doc = compose(env)
    for name, service in doc["services"].items():
        assert image_is_pinned(service["image"]), f"{name}: {service['image']}"
    for name, service in bandmaster_services(doc).items():
        assert service["image"] == f"bandmaster:{package_version()}", name


def test_the_planner_plans_with_the_workers_timing_profile_for_their_model():
    """One variable each: the simulated workers run the profile the planner plans with, the profile is
    the worker model's, and the planner's own start-up check passes; a mismatched model is refused."""
    doc = compose()
    planner = load_service_config(doc["services"]["planner"])
    for name in ("simworker-1", "simworker-2"):
        assert load_service_config(doc["services"][name]).timing_profile == planner.timing_profile, name
    assert load_engine_profile(planner.timing_profile).model == planner.worker_model
    assert build_settings(planner).batch.safe_rps_per_ready_replica > 0
    real = compose({**REAL_WORKERS, "BANDMASTER_WORKER_MODEL": "Qwen/Qwen3-8B"})
    with pytest.raises(ConfigError, match="is for zai-org/GLM-4.5-FP8"):
        build_settings(load_service_config(real["services"]["planner"]))
