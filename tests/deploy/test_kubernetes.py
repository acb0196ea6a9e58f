"""deploy/kubernetes/: render the base and every overlay offline and prove the objects.

* Rendering: `kubectl kustomize <dir>`, the tool itself (the rendering tests skip, naming why, on a
  machine without `kubectl`).
* Schemas: every object validates, strictly (unknown fields refused), against the Kubernetes JSON
  schemas that the `kubernetes-validate` package ships, for the oldest supported and the newest
  Kubernetes minor.
* Flags: every Bandmaster container's command and environment parse with that service's real
  `load_config` (a renamed flag or environment variable fails), and what they configure fits the
  pod: listen addresses bind 0.0.0.0 on declared container ports, scrape annotations name the metrics
  port, every address a service dials is a Service that reaches a pod serving that port.
* Probes, Services, the PodDisruptionBudget, security contexts, resources.
* RBAC: nothing cluster-wide; the planner's Role touches only the worker Deployment (and its scale
  subresource) by name, and that is enough: the planner's own Kubernetes connector, configured from
  the rendered planner container, runs against a local API double that authorizes every request
  with the rendered Role, as the API server would.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from aiohttp import web

from services.batch import config as batch_config
from services.capacity import config as capacity_config
from services.capacity import registrar
from services.common.auth.security import CONTROL_TOKEN_ENV, DATA_TOKEN_ENV
from services.common.clock import FakeClock
from services.common.settings.config import parse_host_port
from services.common.settings.errors import ConfigError
from services.planner import config as planner_config
from services.planner.adapters.connectors import FENCE_ANNOTATION, KubernetesConnector, KubernetesTarget
from services.planner.adapters.profile import load_engine_profile
from services.planner.server import build_settings
from services.router import config as router_config
from services.scheduler import config as scheduler_config
from services.simworker import config as simworker_config
from tests.deploy.image_refs import image_is_pinned, package_version

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "deploy" / "kubernetes"
TARGETS = ["base", "overlays/simulated", "overlays/sglang"]
# The oldest Kubernetes minor the manifests support (grpc probes are GA since 1.27; policy/v1 PDBs,
# autoscaling-free scale subresource) and the newest schema set the package ships.
SCHEMA_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
IMAGE = "bandmaster"


class Service:
    """One Bandmaster entry point: its module, its real config loader and its settings table."""

    def __init__(self, load: Callable[..., Any], settings: list, env_prefixes: tuple[str, ...]) -> None:
        self.load = load
        self.env_names = {s.env for s in settings if s.env}
        self.env_prefixes = env_prefixes


SERVICES = {
    "services.capacity": Service(capacity_config.load_config, capacity_config.SETTINGS, ("BANDMASTER_",)),
    "services.scheduler": Service(scheduler_config.load_config, scheduler_config.SETTINGS, ("BANDMASTER_", "DYN_")),
    "services.router": Service(router_config.load_config, router_config.SETTINGS, ("BANDMASTER_", "DYN_")),
    "services.planner": Service(planner_config.load_config, planner_config.SETTINGS, ("BANDMASTER_",)),
    "services.batch": Service(batch_config.load_config, batch_config.SETTINGS, ("BANDMASTER_",)),
    "services.simworker": Service(
        simworker_config.load_config, list(simworker_config.SETTINGS), ("SIMWORKER_", "BANDMASTER_")
    ),
    "services.capacity.registrar": Service(registrar.load_config, registrar.SETTINGS, ("BANDMASTER_",)),
}
SHARED_ENV = {CONTROL_TOKEN_ENV, DATA_TOKEN_ENV}
POD_IP = "10.1.2.3"


# -- rendering ----------------------------------------------------------------------------------------

KUBECTL_TIMEOUT_S = 120  # renders in well under a second; the bound only keeps a wedged kubectl from hanging CI
_rendered: dict[str, list[dict[str, Any]]] = {}
# Every rendered ConfigMap by (namespace, name), for the kubelet's configMapKeyRef. Names carry a hash of
# the content (Kustomize's generator, the chart's helper), so one name never stands for two contents.
_config_maps: dict[tuple[str, str], dict[str, str]] = {}


def remember_config_maps(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for cm in of_kind(objects, "ConfigMap"):
        key = (cm["metadata"].get("namespace", ""), cm["metadata"]["name"])
        assert _config_maps.setdefault(key, cm.get("data", {})) == cm.get("data", {}), f"ConfigMap {key}: two contents"
    return objects


def tool(name: str) -> str | None:
    """A command on the PATH, else in the venv running the tests (where `make test` installs helm and kubectl)."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), str(Path(sys.executable).parent)]))


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize <directory>` prints (its multi-document YAML, parsed)."""
    kubectl = tool("kubectl")
    if kubectl is None:
        pytest.skip(
            "kubectl is not installed (`make test` installs it): the manifests are rendered by `kubectl kustomize`"
        )
    try:
        done = subprocess.run(
            [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=KUBECTL_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"kubectl kustomize {directory} did not finish in {KUBECTL_TIMEOUT_S} s")
    if done.returncode != 0:
        pytest.fail(f"kubectl kustomize {directory} exited {done.returncode}: {done.stderr.strip()}")
    return remember_config_maps([obj for obj in yaml.safe_load_all(done.stdout) if obj])


def rendered(target: str) -> list[dict[str, Any]]:
    if target not in _rendered:
        _rendered[target] = render(ROOT / target)
    return _rendered[target]


@pytest.fixture(params=TARGETS)
def target_objects(request) -> tuple[str, list[dict[str, Any]]]:
    return request.param, rendered(request.param)


def key_of(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = obj.get("metadata", {})
    return obj.get("apiVersion", ""), obj.get("kind", ""), meta.get("namespace", ""), meta.get("name", "")


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod_spec(deployment)
    return [*spec.get("initContainers", []), *spec["containers"]]


def bandmaster_containers(objects):
    for deployment in of_kind(objects, "Deployment"):
        for container in containers(deployment):
            if container["image"].split(":")[0] == IMAGE:
                yield deployment, container


@pytest.mark.parametrize("target", TARGETS)
def test_renders_and_names_are_unique(target):
    objects = rendered(target)
    assert len(objects) >= 10 and all(o.get("kind") and o.get("metadata", {}).get("name") for o in objects)
    assert len({key_of(o) for o in objects}) == len(objects)
    namespaces = {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"}
    assert namespaces == {named(objects, "Namespace", "bandmaster")["metadata"]["name"]}


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("target", TARGETS)
def test_every_object_validates_against_the_kubernetes_schemas(target, version):
    for obj in rendered(target):
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"{target} {obj['kind']}/{obj['metadata']['name']} (Kubernetes {version}): {exc.message} "
                f"at {'/'.join(map(str, exc.path))}"
            )


def test_the_schema_check_catches_a_wrong_field():
    broken = copy.deepcopy(named(rendered("base"), "Deployment", "router"))
    router = next(c for c in containers(broken) if c["name"] == "router")
    router["readinessProbe"] = {"grpc": {"port": "grpc"}}  # grpc probes take a number
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, SCHEMA_VERSIONS[0], strict=True)


# -- flags and environment through the services' real parsers --------------------------------------


def resolve_env(deployment: dict[str, Any], container: dict[str, Any], *, secrets: bool) -> dict[str, str]:
    """The container's environment as the kubelet gives it: literal values, downward-API fields,
    optional secret keys (present when `secrets`, absent otherwise)."""
    env: dict[str, str] = {}
    namespace = deployment["metadata"]["namespace"]
    fields = {
        "metadata.namespace": namespace,
        "status.podIP": POD_IP,
        "metadata.name": f"{deployment['metadata']['name']}-7d9f8-x2kqz",
    }
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = _expand(str(item["value"]), env)
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] in fields, source
            env[item["name"]] = fields[source["fieldRef"]["fieldPath"]]
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            data = _config_maps.get((namespace, ref["name"]))
            assert data is not None, f"{item['name']}: no ConfigMap {ref['name']} in {namespace}"
            assert ref["key"] in data, f"{item['name']}: ConfigMap {ref['name']} has no key {ref['key']}"
            env[item["name"]] = data[ref["key"]]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            assert ref.get("optional") is True, f"{item['name']}: secrets are optional, so `apply -k` works alone"
            if secrets:
                env[item["name"]] = f"{ref['name']}-{ref['key']}-".ljust(40, "x")
        else:
            pytest.fail(f"unexpected env source {source}")
    return env


def _expand(text: str, env: Mapping[str, str]) -> str:
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def command_of(container: dict[str, Any]) -> tuple[str, list[str]]:
    command = container.get("command", [])
    assert command[:2] == ["python", "-m"] and len(command) == 3, command
    return command[2], list(container.get("args", []))


def load(deployment, container, *, secrets: bool = False):
    module, args = command_of(container)
    assert module in SERVICES, f"{module}: not a Bandmaster entry point"
    env = resolve_env(deployment, container, secrets=secrets)
    args = [_expand(a, env) for a in args]
    unresolved = [a for a in args if "$(" in a]
    assert not unresolved, f"{container['name']}: unresolved variables in {unresolved}"
    return module, SERVICES[module].load(args, env)


def container_ports(container: dict[str, Any]) -> dict[str | int, int]:
    ports: dict[str | int, int] = {}
    for p in container.get("ports", []):
        ports[p["containerPort"]] = p["containerPort"]
        if "name" in p:
            ports[p["name"]] = p["containerPort"]
    return ports


@pytest.mark.parametrize("secrets", [False, True], ids=["no-secret", "tokens"])
@pytest.mark.parametrize("target", TARGETS)
def test_every_bandmaster_container_parses_with_its_service_config(target, secrets):
    seen = set()
    for deployment, container in bandmaster_containers(rendered(target)):
        module, _config = load(deployment, container, secrets=secrets)
        seen.add(module)
    assert seen >= {
        "services.capacity",
        "services.scheduler",
        "services.router",
        "services.planner",
        "services.batch",
        "services.capacity.registrar",
    }


@pytest.mark.parametrize("target", TARGETS)
def test_environment_names_are_real_settings(target):
    """A renamed environment variable would be silently ignored; every one of ours must be a setting."""
    for _deployment, container in bandmaster_containers(rendered(target)):
        module, _ = command_of(container)
        service = SERVICES[module]
        for item in container.get("env", []):
            name = item["name"]
            if name.startswith(service.env_prefixes):
                assert name in service.env_names | SHARED_ENV, f"{module}: {name} is not one of its settings"


def test_a_renamed_flag_fails():
    deployment = named(rendered("base"), "Deployment", "planner")
    container = dict(containers(deployment)[0])
    container["args"] = [a.replace("--k8s-deployment", "--k8s-deploy") for a in container["args"]]
    with pytest.raises(ValueError, match="k8s-deploy"):
        load(deployment, container)


@pytest.mark.parametrize("target", TARGETS)
def test_services_bind_all_interfaces_on_declared_ports_and_scrape_their_metrics_port(target):
    for deployment, container in bandmaster_containers(rendered(target)):
        module, config = load(deployment, container)
        ports = container_ports(container)
        annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
        if module == "services.capacity.registrar":
            continue
        if module == "services.simworker":
            listening = [config.port]
            assert config.host == "0.0.0.0"
            metrics_port = config.port
        else:
            host, grpc_port = parse_host_port(config.listen, "listen")
            assert host == "0.0.0.0", f"{module} listens on {host}"
            listening = [grpc_port, config.metrics_port]
            metrics_port = config.metrics_port
            if module == "services.router":
                listening.append(config.http_port)
            if module == "services.batch":
                http_host, http_port = parse_host_port(config.http_listen, "http_listen")
                assert http_host == "0.0.0.0"
                listening.append(http_port)
        for port in listening:
            assert port in ports, f"{module} listens on {port}, not a containerPort of {container['name']}"
        assert annotations.get("prometheus.io/scrape") == "true", deployment["metadata"]["name"]
        assert annotations.get("prometheus.io/port") == str(metrics_port), deployment["metadata"]["name"]
        assert annotations.get("prometheus.io/path") == "/metrics"


def reaches(objects, address: str, namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Service `host` of `host:port` and the Deployment behind it, checked to serve `port`."""
    host, port = parse_host_port(address, "address")
    services = [
        s
        for s in of_kind(objects, "Service")
        if s["metadata"]["name"] == host and s["metadata"]["namespace"] == namespace
    ]
    assert len(services) == 1, f"{address}: no Service {host!r} in {namespace}"
    service = services[0]
    service_port = next((p for p in service["spec"]["ports"] if p["port"] == port), None)
    assert service_port is not None, f"{address}: Service {host} has no port {port}"
    deployment = selected_deployment(objects, service)
    target = service_port.get("targetPort", port)
    assert any(target in container_ports(c) for c in containers(deployment)), (
        f"{address}: targetPort {target!r} is no containerPort of {deployment['metadata']['name']}"
    )
    return service, deployment


def selected_deployment(objects, service) -> dict[str, Any]:
    selector = service["spec"]["selector"]
    matches = [
        d
        for d in of_kind(objects, "Deployment")
        if d["metadata"]["namespace"] == service["metadata"]["namespace"]
        and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert len(matches) == 1, f"Service {service['metadata']['name']} selects {len(matches)} Deployments"
    return matches[0]


def _url_address(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


@pytest.mark.parametrize("target", TARGETS)
def test_every_address_a_service_dials_is_a_service_serving_that_port(target):
    objects = rendered(target)
    dialled: list[tuple[str, str, str]] = []  # (who, address, the Deployment that must answer)
    for deployment, container in bandmaster_containers(objects):
        module, c = load(deployment, container)
        if module == "services.scheduler":
            dialled += [(module, c.capacity_addr, "capacity"), (module, _url_address(c.state_redis_url), "redis")]
        elif module == "services.router":
            dialled += [
                (module, c.scheduler_addr, "scheduler"),
                (module, c.capacity_addr, "capacity"),
                (module, _url_address(c.batch_url), "batch"),
            ]
        elif module == "services.planner":
            dialled += [
                (module, c.capacity, "capacity"),
                (module, c.scheduler, "scheduler"),
                (module, _url_address(c.redis_url), "redis"),
            ]
        elif module == "services.batch":
            dialled += [(module, c.planner, "planner"), (module, _url_address(c.dispatch_url), "router")]
        elif module == "services.capacity.registrar":
            dialled.append((module, c.capacity_addr, "capacity"))
    assert len(dialled) >= 10
    for who, address, expected in dialled:
        _, deployment = reaches(objects, address, "bandmaster")
        assert deployment["metadata"]["name"] == expected, f"{who} dials {address}"


@pytest.mark.parametrize("target", TARGETS)
def test_the_registrar_registers_the_port_its_worker_serves(target):
    worker = named(rendered(target), "Deployment", "worker")
    by_name = {c["name"]: c for c in containers(worker)}
    _, config = load(worker, by_name["registrar"])
    assert urlsplit(config.worker_url).hostname == POD_IP
    assert urlsplit(config.worker_url).port in container_ports(by_name["worker"]).values()
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert by_name["worker"][probe]["httpGet"]["path"] == "/health"


# -- probes, Services, PDB, replicas --------------------------------------------------------------

PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


@pytest.mark.parametrize("target", TARGETS)
def test_every_probe_port_is_a_container_port(target):
    for deployment in of_kind(rendered(target), "Deployment"):
        for container in containers(deployment):
            ports = container_ports(container)
            for probe_name in PROBES:
                probe = container.get(probe_name)
                if probe is None:
                    continue
                handler = next(k for k in ("grpc", "httpGet", "tcpSocket", "exec") if k in probe)
                if handler != "exec":
                    assert probe[handler]["port"] in ports, (
                        f"{deployment['metadata']['name']}/{container['name']} {probe_name} "
                        f"port {probe[handler]['port']}"
                    )


@pytest.mark.parametrize("target", TARGETS)
def test_grpc_services_are_probed_with_grpc_health(target):
    for deployment, container in bandmaster_containers(rendered(target)):
        module, config = load(deployment, container)
        if module in ("services.simworker", "services.capacity.registrar"):
            continue
        grpc_port = parse_host_port(config.listen, "listen")[1]
        grpc_probes = [p for p in PROBES if "grpc" in container.get(p, {})]
        assert grpc_probes, f"{module}: no grpc.health.v1 probe"
        assert all(container[p]["grpc"]["port"] == grpc_port for p in grpc_probes)
        assert "readinessProbe" in container and "livenessProbe" in container


@pytest.mark.parametrize("target", TARGETS)
def test_every_service_selects_one_deployment_and_its_ports(target):
    objects = rendered(target)
    for service in of_kind(objects, "Service"):
        deployment = selected_deployment(objects, service)
        ports = {k for c in containers(deployment) for k in container_ports(c)}
        for port in service["spec"]["ports"]:
            assert port.get("targetPort", port["port"]) in ports, (service["metadata"]["name"], port)


@pytest.mark.parametrize("target", TARGETS)
def test_routers_are_replicated_with_a_pdb_and_no_autoscaler(target):
    objects = rendered(target)
    router = named(objects, "Deployment", "router")
    assert router["spec"]["replicas"] >= 2
    assert not of_kind(objects, "HorizontalPodAutoscaler")
    pdbs = of_kind(objects, "PodDisruptionBudget")
    assert len(pdbs) == 1
    pdb = pdbs[0]
    labels = router["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    others = [
        d
        for d in of_kind(objects, "Deployment")
        if d is not router
        and pdb["spec"]["selector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert not others, "the PDB selects more than the routers"
    assert 1 <= pdb["spec"]["maxUnavailable"] < router["spec"]["replicas"]


@pytest.mark.parametrize("target", TARGETS)
def test_single_writers_are_recreated_and_the_worker_count_is_the_planners(target):
    objects = rendered(target)
    for name in ("planner", "batch", "redis"):
        deployment = named(objects, "Deployment", name)
        assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate", name
    # No spec.replicas: `kubectl apply` must not reset what the planner set through the scale subresource.
    assert "replicas" not in named(objects, "Deployment", "worker")["spec"]


@pytest.mark.parametrize("target", TARGETS)
def test_pods_run_as_non_root_with_requests_and_limits(target):
    for deployment in of_kind(rendered(target), "Deployment"):
        spec = pod_spec(deployment)
        assert spec["securityContext"]["runAsNonRoot"] is True, deployment["metadata"]["name"]
        assert spec["securityContext"].get("runAsUser", 1) != 0
        for container in containers(deployment):
            where = f"{deployment['metadata']['name']}/{container['name']}"
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert sc.get("runAsUser", 1) != 0 and sc.get("privileged") is not True, where
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][kind]), where


@pytest.mark.parametrize("target", TARGETS)
def test_bandmaster_images_are_tagged(target):
    for _, container in bandmaster_containers(rendered(target)):
        assert re.fullmatch(r"bandmaster:[A-Za-z0-9_][A-Za-z0-9_.-]*", container["image"]), container["image"]
        assert not container["image"].endswith(":latest")


def test_every_image_is_pinned(target_objects):
    """No `:latest`, no untagged image: every container names a tag (or a digest); Bandmaster's own tag
    is the package version, SGLang's a release."""
    target, objects = target_objects
    for deployment in of_kind(objects, "Deployment"):
        for container in containers(deployment):
            image = container["image"]
            where = f"{target} {deployment['metadata']['name']}/{container['name']}: {image}"
            assert image_is_pinned(image), where
            if image.split(":")[0] == IMAGE:
                assert image == f"{IMAGE}:{package_version()}", where


@pytest.mark.parametrize(
    "image, pinned",
    [
        ("bandmaster:0.1.0", True),
        ("lmsysorg/sglang:v0.5.11-cu129", True),
        ("registry:5000/a/b:1.2", True),
        ("redis@sha256:" + "a" * 64, True),
        ("bandmaster", False),
        ("lmsysorg/sglang:latest", False),
        ("registry:5000/a/b", False),
        ("sglang:", False),
    ],
)
def test_the_pin_check_itself(image, pinned):
    assert image_is_pinned(image) is pinned


def test_sglang_runs_a_pinned_release():
    worker = named(rendered("overlays/sglang"), "Deployment", "worker")
    (sglang,) = [c for c in containers(worker) if c["name"] == "worker"]
    assert re.fullmatch(r"lmsysorg/sglang:v\d+\.\d+\.\d+(\.post\d+)?-cu\d+", sglang["image"]), sglang["image"]


def test_the_sglang_model_cache_is_a_persistent_shared_volume():
    """The weights (HF_HOME) live on a PersistentVolumeClaim every worker pod mounts, not on an emptyDir
    that each new replica, reschedule or restart fills again from the hub."""
    objects = rendered("overlays/sglang")
    worker = named(objects, "Deployment", "worker")
    (sglang,) = [c for c in containers(worker) if c["name"] == "worker"]
    env = resolve_env(worker, sglang, secrets=False)
    hf_home = Path(env["HF_HOME"])
    mounts = [
        m for m in sglang["volumeMounts"] if hf_home == Path(m["mountPath"]) or Path(m["mountPath"]) in hf_home.parents
    ]
    assert len(mounts) == 1, f"HF_HOME {hf_home} is on {mounts}"
    (volume,) = [v for v in pod_spec(worker)["volumes"] if v["name"] == mounts[0]["name"]]
    assert "emptyDir" not in volume and "persistentVolumeClaim" in volume, volume
    claim = named(objects, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    assert claim["metadata"]["namespace"] == worker["metadata"]["namespace"]
    # The planner runs several worker pods on any node: one claim they all mount.
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "100Gi"  # the size docs/deploy/kubernetes.md names
    assert "storageClassName" not in claim["spec"], "left to the cluster's default or an operator's patch"
    assert pod_spec(worker)["securityContext"]["fsGroup"] == pod_spec(worker)["securityContext"]["runAsUser"]


def planner_and_worker_models(objects) -> tuple[Any, str, str]:
    """The planner's config, the model the workers load (or simulate) and their timing profile (sim only)."""
    planner = named(objects, "Deployment", "planner")
    _, config = load(planner, containers(planner)[0])
    worker = named(objects, "Deployment", config.k8s_deployment)
    (engine,) = [c for c in containers(worker) if c["name"] == "worker"]
    env = resolve_env(worker, engine, secrets=False)
    if engine["image"].split(":")[0] == IMAGE:
        _, sim = load(worker, engine)
        return config, load_engine_profile(sim.timing_profile).model, sim.timing_profile
    args = [_expand(a, env) for a in engine["args"]]
    (model,) = [a.split("=", 1)[1] for a in args if a.startswith("--model-path=")]
    return config, model, ""


def test_the_planner_plans_for_the_model_the_workers_serve(target_objects):
    """One source (the worker-model ConfigMap): the planner's timing profile is the served model's, and
    the planner's own start-up check (the one that refuses a mismatch) passes on the rendered config."""
    _, objects = target_objects
    config, served, sim_profile = planner_and_worker_models(objects)
    assert config.worker_model == served, "the planner is told the model the workers serve"
    assert load_engine_profile(config.timing_profile).model == served
    if sim_profile:
        assert config.timing_profile == sim_profile, "the simworkers run the timing the planner plans with"
    assert build_settings(config).batch.safe_rps_per_ready_replica > 0


def test_a_planner_given_another_models_profile_refuses_to_start():
    objects = rendered("overlays/sglang")
    planner = copy.deepcopy(named(objects, "Deployment", "planner"))
    container = containers(planner)[0]
    container["env"] = [
        {"name": e["name"], "value": "Qwen/Qwen3-8B"} if e["name"] == "BANDMASTER_PLANNER_WORKER_MODEL" else e
        for e in container["env"]
    ]
    _, config = load(planner, container)
    with pytest.raises(ConfigError, match="is for meta-llama/Llama-3.1-8B-Instruct") as info:
        build_settings(config)
    assert info.value.field == "worker_model"


@pytest.mark.parametrize("target", TARGETS)
def test_the_scheduler_runs_active_and_standby_with_leader_election_in_redis(target):
    """Two replicas, one pod replaced at a time (the leader releases its lease when told to stop); the
    lease and the table in Redis; each replica advertises its pod address, which standbys redirect to."""
    objects = rendered(target)
    deployment = named(objects, "Deployment", "scheduler")
    assert deployment["spec"]["replicas"] == 2
    strategy = deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate" and strategy["rollingUpdate"]["maxSurge"] == 0
    (container,) = [c for c in containers(deployment) if c["name"] == "scheduler"]
    _, config = load(deployment, container)
    assert config.leader_election and config.state_store == "redis"
    assert config.advertise_addr == f"{POD_IP}:50052"  # the loader expands $(POD_IP) as the kubelet does
    pod_ip = next(e for e in container["env"] if e["name"] == "POD_IP")
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


# -- RBAC -----------------------------------------------------------------------------------------


def rule_allows(rule: dict[str, Any], verb: str, group: str, resource: str, name: str) -> bool:
    """Kubernetes RBAC's rule match (wildcards included), for a request on a named object."""
    return (
        (group in rule.get("apiGroups", []) or "*" in rule.get("apiGroups", []))
        and (
            resource in rule.get("resources", [])
            or "*" in rule.get("resources", [])
            or ("/" in resource and resource.split("/")[0] + "/*" in rule.get("resources", []))
        )
        and (verb in rule.get("verbs", []) or "*" in rule.get("verbs", []))
        and (not rule.get("resourceNames") or name in rule["resourceNames"])
    )


def planner_permissions(objects) -> tuple[list[dict[str, Any]], str]:
    """The rules the planner's pod is granted, and the namespace they hold in."""
    planner = named(objects, "Deployment", "planner")
    account = pod_spec(planner)["serviceAccountName"]
    namespace = planner["metadata"]["namespace"]
    named(objects, "ServiceAccount", account)
    rules = []
    for binding in of_kind(objects, "RoleBinding"):
        if any(
            s["kind"] == "ServiceAccount" and s["name"] == account and s.get("namespace") == namespace
            for s in binding["subjects"]
        ):
            assert binding["roleRef"]["kind"] == "Role"
            rules += named(objects, "Role", binding["roleRef"]["name"])["rules"]
    return rules, namespace


@pytest.mark.parametrize("target", TARGETS)
def test_rbac_is_namespaced_and_limited_to_the_worker_deployment(target):
    objects = rendered(target)
    assert not of_kind(objects, "ClusterRole") and not of_kind(objects, "ClusterRoleBinding")
    _, planner = next((d, c) for d, c in bandmaster_containers(objects) if d["metadata"]["name"] == "planner")
    _, config = load(named(objects, "Deployment", "planner"), planner)
    assert config.connector == "kubernetes"
    worker = named(objects, "Deployment", config.k8s_deployment)
    assert config.k8s_namespace == worker["metadata"]["namespace"]
    for role in of_kind(objects, "Role"):
        for rule in role["rules"]:
            assert rule["apiGroups"] == ["apps"], rule
            assert set(rule["resources"]) <= {"deployments", "deployments/scale"}, rule
            assert rule["resourceNames"] == [config.k8s_deployment], rule
            assert set(rule["verbs"]) <= {"get", "patch"}, rule
    rules, namespace = planner_permissions(objects)
    assert namespace == config.k8s_namespace
    for verb in ("get", "patch"):
        assert any(rule_allows(r, verb, "apps", "deployments/scale", config.k8s_deployment) for r in rules)
    for verb, resource, name in [
        ("get", "deployments/scale", "router"),
        ("patch", "deployments", "scheduler"),
        ("delete", "deployments", config.k8s_deployment),
        ("update", "deployments/scale", config.k8s_deployment),
        ("list", "deployments", ""),
        ("get", "secrets", config.k8s_deployment),
        ("create", "pods", ""),
    ]:
        assert not any(rule_allows(r, verb, "apps" if "deploy" in resource else "", resource, name) for r in rules)
    # Only the planner's pod carries API credentials.
    for deployment in of_kind(objects, "Deployment"):
        if deployment is not named(objects, "Deployment", "planner"):
            assert pod_spec(deployment).get("automountServiceAccountToken") is False, deployment["metadata"]["name"]
            assert "serviceAccountName" not in pod_spec(deployment)


class AuthorizingApiServer:
    """apps/v1 deployments and their scale subresource, one Deployment, every request authorized with
    the given RBAC rules for one namespace (403 Forbidden otherwise), resourceVersion preconditions."""

    def __init__(self, rules, namespace: str, deployment: dict[str, Any]) -> None:
        self.rules = rules
        self.namespace = namespace
        self.deployment = deployment
        self.replicas = deployment["spec"].get("replicas", 1)
        self.rv = 1
        self.annotations: dict[str, str] = {}
        self.requests: list[tuple[str, str, str, str, int]] = []

    def _state(self):
        name = self.deployment["metadata"]["name"]
        n = self.replicas
        meta = {
            "name": name,
            "namespace": self.namespace,
            "resourceVersion": str(self.rv),
            "generation": self.rv,
            "annotations": dict(self.annotations),
        }
        deployment = {
            **self.deployment,
            "metadata": meta,
            "spec": {**self.deployment["spec"], "replicas": n},
            "status": {
                "replicas": n,
                "readyReplicas": n,
                "availableReplicas": n,
                "updatedReplicas": n,
                "observedGeneration": self.rv,
            },
        }
        scale = {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": meta,
            "spec": {"replicas": n},
            "status": {"replicas": n},
        }
        return deployment, scale

    async def handle(self, request: web.Request) -> web.Response:
        info = request.match_info
        verb = {"GET": "get", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[request.method]
        resource = "deployments" + (f"/{info['sub']}" if info.get("sub") else "")
        allowed = info["ns"] == self.namespace and any(
            rule_allows(r, verb, "apps", resource, info["name"]) for r in self.rules
        )
        self.requests.append((verb, resource, info["ns"], info["name"], 200 if allowed else 403))
        if not allowed:
            return web.json_response(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": "Forbidden",
                    "code": 403,
                    "message": f"cannot {verb} {resource} {info['name']}",
                },
                status=403,
            )
        if info["name"] != self.deployment["metadata"]["name"]:
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        if verb == "patch":
            body = await request.json()
            want = body.get("metadata", {}).get("resourceVersion")
            if want is not None and want != str(self.rv):
                return web.json_response({"kind": "Status", "code": 409, "reason": "Conflict"}, status=409)
            if info.get("sub") == "scale":
                self.replicas = body["spec"]["replicas"]
            else:
                self.annotations.update(body.get("metadata", {}).get("annotations", {}))
            self.rv += 1
        deployment, scale = self._state()
        return web.json_response(scale if info.get("sub") == "scale" else deployment)

    async def start(self) -> int:
        app = web.Application()
        base = "/apis/apps/v1/namespaces/{ns}/deployments/{name}"
        for path in (base, base + "/{sub}"):
            app.router.add_route("*", path, self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        await self.runner.cleanup()


@pytest.mark.parametrize("target", TARGETS)
async def test_the_planner_connector_scales_the_worker_with_exactly_its_role(target):
    objects = rendered(target)
    planner = named(objects, "Deployment", "planner")
    _, config = load(planner, containers(planner)[0])
    rules, namespace = planner_permissions(objects)
    api = AuthorizingApiServer(rules, namespace, named(objects, "Deployment", config.k8s_deployment))
    port = await api.start()
    try:
        connector = KubernetesConnector(
            FakeClock(),
            KubernetesTarget(
                config.k8s_deployment,
                config.k8s_namespace,
                f"http://127.0.0.1:{port}",
                request_timeout_s=5,
                writer_fence=config.k8s_writer_fence,
            ),
        )
        await connector.start()
        assert api.annotations.get(FENCE_ANNOTATION) == connector.target.writer_id
        assert (await connector.inventory()).ready == 1
        await connector.scale_to(3)
        assert api.replicas == 3
        assert (await connector.inventory()).expected == 3
        assert api.requests and all(status == 200 for *_, status in api.requests), api.requests
        touched = {(verb, resource) for verb, resource, *_ in api.requests}
        assert touched == {
            ("get", "deployments"),
            ("patch", "deployments"),
            ("get", "deployments/scale"),
            ("patch", "deployments/scale"),
        }
        # The same Role does not let it scale anything else.
        other = KubernetesConnector(
            FakeClock(),
            KubernetesTarget(
                "router", config.k8s_namespace, f"http://127.0.0.1:{port}", request_timeout_s=5, writer_fence=False
            ),
        )
        with pytest.raises(Exception, match="403|Forbidden"):
            await other.scale_to(5)
    finally:
        await api.stop()
