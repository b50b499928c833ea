"""The CRDs of every controller, and `make manifests`, which writes them to manifests/crds/ from the API types.

`python -m gpuops.controllers.crds` rewrites the YAML; `--check` exits 1, naming the stale files, when the committed
YAML differs from what the types generate (the test suite runs the same check).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuops.controllers.registry import CONTROLLERS
from gpuops.kube.crd import CustomResource, render

__all__ = ["CRDS", "generated", "main"]

CRDS: tuple[CustomResource, ...] = tuple(crd for c in CONTROLLERS for crd in c.custom_resources())
"""Every registered controller's, in the order manifests/crds/Kustomization lists them."""


def _source(resource: CustomResource) -> str:
    return resource.resource.struct.__module__.replace(".", "/") + ".py"


def generated() -> dict[str, str]:
    """File name (`<plural>.<group>.yaml`) -> YAML text, for every CRD."""
    return {f"{r.name}.yaml": render(r, _source(r)) for r in CRDS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuops.controllers.crds", description=__doc__)
    parser.add_argument("directory", nargs="?", type=Path, default=Path("manifests/crds"))
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    stale: list[str] = []
    for name, text in generated().items():
        path: Path = args.directory / name
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text)
    if args.check and stale:
        print(f"stale CRDs (run `make manifests`): {', '.join(stale)}", file=sys.stderr)
        return 1
    if not args.check:
        print(f"{len(stale)} of {len(CRDS)} CRDs rewritten in {args.directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
