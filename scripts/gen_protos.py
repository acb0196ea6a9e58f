"""Regenerate the committed Python code for proto/bandmaster/**.proto.

Run with the pinned grpcio-tools (see pyproject.toml, extra `dev`):

    python scripts/gen_protos.py            # rewrite bandmaster/
    python scripts/gen_protos.py --check    # exit 1 if the committed code is stale

The output goes to the top-level `bandmaster/` package, one module pair per proto file.
"""

from __future__ import annotations

import argparse
import filecmp
import pathlib
import shutil
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "bandmaster"


def generate(out_dir: pathlib.Path) -> None:
    import grpc_tools
    from grpc_tools import protoc  # imported late: only the dev extra has it

    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    if not protos:
        raise SystemExit("no .proto files under proto/")
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir.parent}",
        f"--pyi_out={out_dir.parent}",
        f"--grpc_python_out={out_dir.parent}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    # Every generated directory is a regular package so that setuptools finds it.
    for directory in [out_dir, *[d for d in out_dir.rglob("*") if d.is_dir()]]:
        if directory.name == "__pycache__":
            continue
        init = directory / "__init__.py"
        if not init.exists():
            init.write_text('"""Generated from proto/ by scripts/gen_protos.py. Do not edit."""\n')


def _files(root: pathlib.Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def check() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        fresh = pathlib.Path(tmp) / "bandmaster"
        generate(fresh)
        committed = _files(OUT_DIR) if OUT_DIR.exists() else set()
        regenerated = _files(fresh)
        stale = sorted(committed ^ regenerated)
        for name in sorted(committed & regenerated):
            if not filecmp.cmp(OUT_DIR / name, fresh / name, shallow=False):
                stale.append(name)
    if stale:
        print("generated protobuf code is stale; run `python scripts/gen_protos.py`:")
        for name in stale:
            print(f"  bandmaster/{name}")
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if regeneration would change the code")
    args = parser.parse_args()
    if args.check:
        return check()
    if OUT_DIR.exists():
        shutil.rmtree(OUT_DIR)
    generate(OUT_DIR)
    return 0


if __name__ == "__main__":
    sys.exit(main())
