"""An offline renderer for the subset of Kustomize that deploy/kubernetes/ uses.

The test must render the manifests on machines without `kubectl`/`kustomize`, so this module
implements, for kustomization files, exactly these fields and refuses any other (keeping the
manifests inside what is rendered faithfully here):

* `resources`: YAML files (any number of documents) and directories holding a kustomization
  (rendered first, recursively: an overlay sees its base's output).
* `patches` with `path` only: a strategic-merge patch naming its target by apiVersion, kind and
  metadata.name. Maps merge recursively, `null` deletes a key, lists of maps merge by the API's
  patch merge key where the API has one (containers, initContainers, env, volumes by `name`;
  volumeMounts by `mountPath`; container ports by `containerPort`; Service ports by `port`): the
  patch's items first, in its order, then the original items it does not name. Every other list
  is replaced. `$patch` directives are refused.
* `namespace`: sets metadata.namespace of every namespaced object, renames Namespace objects, and
  sets the namespace of RoleBinding/ClusterRoleBinding ServiceAccount subjects named `default` or
  naming a ServiceAccount of the output (as kustomize's name-reference step does).
* `labels` (`pairs`, `includeTemplates`; `includeSelectors: true` is refused): metadata labels of
  every object, and with `includeTemplates` the pod template labels of workloads.
* `replicas` (`name`, `count`): spec.replicas of the workload of that name.
* `images` (`name`, `newName`, `newTag`, `digest`): every container and init container image whose
  name matches.

Within one kustomization the steps run in kustomize's order for these fields: resources, patches,
namespace, labels, replicas, images. Where `kubectl` is installed the test checks that
`kubectl kustomize` renders the same objects (tests/deploy/test_kubernetes.py).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_FIELDS = {"apiVersion", "kind", "resources", "patches", "namespace", "labels", "replicas", "images"}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "PersistentVolume",
    "StorageClass",
    "CustomResourceDefinition",
    "PriorityClass",
    "IngressClass",
    "RuntimeClass",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "APIService",
}
WORKLOADS_WITH_TEMPLATE = {"Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job"}
WORKLOADS_WITH_REPLICAS = {"Deployment", "ReplicaSet", "StatefulSet"}
# Patch merge keys of the lists this renderer merges (x-kubernetes-patch-merge-key in the API).
MERGE_KEY_BY_FIELD = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
    "volumeDevices": "devicePath",
}


class KustomizeError(ValueError):
    pass


def render(directory: str | Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize <directory>` would print (order aside)."""
    directory = Path(directory)
    kfile = next((directory / n for n in KUSTOMIZATION_FILES if (directory / n).is_file()), None)
    if kfile is None:
        raise KustomizeError(f"{directory}: no kustomization file")
    spec = yaml.safe_load(kfile.read_text()) or {}
    unsupported = set(spec) - SUPPORTED_FIELDS
    if unsupported:
        raise KustomizeError(f"{kfile}: fields outside the rendered subset: {sorted(unsupported)}")

    objects: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        objects.extend(render(path) if path.is_dir() else load_documents(path))
    _check_unique(objects, kfile)

    for patch_entry in spec.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise KustomizeError(f"{kfile}: only `patches: - path: FILE` is rendered, got {sorted(patch_entry)}")
        for patch in load_documents(directory / patch_entry["path"]):
            target = _find(objects, patch.get("apiVersion"), patch.get("kind"), patch["metadata"]["name"])
            objects[objects.index(target)] = strategic_merge(target, patch)

    if "namespace" in spec:
        _set_namespace(objects, spec["namespace"])
    for label_set in spec.get("labels", []):
        _add_labels(objects, label_set, kfile)
    for replica in spec.get("replicas", []):
        target = next(
            (o for o in objects if o["kind"] in WORKLOADS_WITH_REPLICAS and o["metadata"]["name"] == replica["name"]),
            None,
        )
        if target is None:
            raise KustomizeError(f"{kfile}: replicas: no workload named {replica['name']!r}")
        target["spec"]["replicas"] = int(replica["count"])
    for image in spec.get("images", []):
        for obj in objects:
            _rewrite_images(obj, image)
    return objects


def load_documents(path: Path) -> list[dict[str, Any]]:
    with open(path) as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc]


def key_of(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = obj.get("metadata", {})
    return obj.get("apiVersion", ""), obj.get("kind", ""), meta.get("namespace", ""), meta.get("name", "")


def _check_unique(objects: list[dict[str, Any]], where: Path) -> None:
    seen: set[tuple[str, str, str, str]] = set()
    for obj in objects:
        if key_of(obj) in seen:
            raise KustomizeError(f"{where}: {key_of(obj)} appears twice")
        seen.add(key_of(obj))


def _find(objects: list[dict[str, Any]], api_version: str | None, kind: str | None, name: str) -> dict[str, Any]:
    found = [
        o
        for o in objects
        if o.get("kind") == kind
        and o["metadata"]["name"] == name
        and (api_version is None or o.get("apiVersion") == api_version)
    ]
    if len(found) != 1:
        raise KustomizeError(f"patch target {api_version} {kind} {name}: {len(found)} matches")
    return found[0]


# -- strategic merge --------------------------------------------------------------------------------


def strategic_merge(original: Any, patch: Any, field: str = "") -> Any:
    """`patch` merged into a copy of `original` (see the module docstring for the rules)."""
    if isinstance(patch, dict):
        if any(k.startswith("$") for k in patch):
            raise KustomizeError(f"patch directives are not rendered: {[k for k in patch if k.startswith('$')]}")
        if not isinstance(original, dict):
            return _without_nulls(patch)
        merged = copy.deepcopy(original)
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = strategic_merge(merged[key], value, key)
            else:
                merged[key] = _without_nulls(value)
        return merged
    if isinstance(patch, list):
        merge_key = _merge_key(field, original, patch)
        if merge_key is None or not isinstance(original, list):
            return _without_nulls(patch)
        # kustomize's order: the patch's items (merged with their originals) in the patch's order, then
        # the original items the patch does not name, in their order.
        merged = []
        for item in patch:
            if not isinstance(item, dict) or merge_key not in item:
                raise KustomizeError(f"list {field!r}: every patch item needs its merge key {merge_key!r}")
            base = next((o for o in original if o.get(merge_key) == item[merge_key]), None)
            merged.append(_without_nulls(item) if base is None else strategic_merge(base, item, field))
        named = {item[merge_key] for item in patch}
        merged.extend(copy.deepcopy(o) for o in original if o.get(merge_key) not in named)
        return merged
    return patch


def _merge_key(field: str, original: Any, patch: list[Any]) -> str | None:
    if field in MERGE_KEY_BY_FIELD:
        return MERGE_KEY_BY_FIELD[field]
    if field == "ports":
        items = [*(original if isinstance(original, list) else []), *patch]
        # Container ports merge by containerPort, Service ports by port.
        return "containerPort" if any(isinstance(i, dict) and "containerPort" in i for i in items) else "port"
    return None


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return copy.deepcopy(value)


# -- transformers -----------------------------------------------------------------------------------


def _set_namespace(objects: list[dict[str, Any]], namespace: str) -> None:
    for obj in objects:
        if obj["kind"] == "Namespace":
            obj["metadata"]["name"] = namespace
        elif obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = namespace
    service_accounts = {
        o["metadata"]["name"]: o["metadata"].get("namespace", "") for o in objects if o["kind"] == "ServiceAccount"
    }
    for obj in objects:
        if obj["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        for subject in obj.get("subjects", []):
            if subject.get("kind") != "ServiceAccount":
                continue
            if subject.get("name") == "default":
                subject["namespace"] = namespace
            elif subject.get("name") in service_accounts:
                subject["namespace"] = service_accounts[subject["name"]]


def _add_labels(objects: list[dict[str, Any]], label_set: dict[str, Any], where: Path) -> None:
    unsupported = set(label_set) - {"pairs", "includeTemplates", "includeSelectors"}
    if unsupported or label_set.get("includeSelectors"):
        raise KustomizeError(f"{where}: labels: only pairs and includeTemplates are rendered")
    pairs = {str(k): _label_value(v, where) for k, v in label_set["pairs"].items()}
    for obj in objects:
        obj["metadata"].setdefault("labels", {}).update(pairs)
        if label_set.get("includeTemplates") and obj["kind"] in WORKLOADS_WITH_TEMPLATE:
            template = obj["spec"].setdefault("template", {})
            template.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)


def _label_value(value: Any, where: Path) -> str:
    if not isinstance(value, str):
        raise KustomizeError(f"{where}: label value {value!r} must be a string (kustomize refuses it)")
    return value


def _split_image(image: str) -> tuple[str, str, str]:
    """'repo/name:tag@sha256:...' -> (name, tag, digest)."""
    name, _, digest = image.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = ""
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
    return name, tag, digest


def _rewrite_images(obj: Any, image: dict[str, Any]) -> None:
    if isinstance(obj, dict):
        for field in ("containers", "initContainers"):
            for container in obj.get(field, []) if isinstance(obj.get(field), list) else []:
                name, tag, digest = _split_image(container.get("image", ""))
                if name != image["name"]:
                    continue
                name = image.get("newName", name)
                if "digest" in image:
                    container["image"] = f"{name}@{image['digest']}"
                elif "newTag" in image:
                    container["image"] = f"{name}:{image['newTag']}"
                else:
                    container["image"] = name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")
        for value in obj.values():
            _rewrite_images(value, image)
    elif isinstance(obj, list):
        for value in obj:
            _rewrite_images(value, image)
