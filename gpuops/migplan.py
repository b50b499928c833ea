"""`gpuops mig plan`: where MIG slices would go on one GPU, as JSON, without touching a GPU.

    gpuops mig plan --gpu A100-40GB --existing 1g.5gb@0 2g.10gb 4g.20gb
    [{"profile": "2g.10gb", "start": 4, "size": 2}, {"profile": "4g.20gb", "start": 0, "size": 4}]

Exit status: 0 with the placements (in request order) on stdout; 1 when the request does not fit next to
the existing slices (the reason and what is still free go to stderr); 2 for bad input (unknown model,
malformed or not offered profile, an existing layout the GPU could not hold, bad arguments).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TextIO

from .accounting import mig
from .accounting.errors import AccountingError


class _Usage(Exception):
    """Bad arguments: argparse's message, reported with exit status 2 instead of SystemExit."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _Usage(message)


def build_parser(prog: str = "gpuops mig plan") -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description="Plan where MIG GPU instances would go on one GPU (fragmentation-aware; the batch is "
                    "solved jointly, so the order of PROFILEs does not matter). Prints JSON.",
        epilog="Profiles are NVIDIA's names for the model (1g.10gb, 1g.10gb+me, nvidia.com/mig-1g.10gb, "
               "MIG 1g.10gb). Exit status: 0 placed, 1 does not fit, 2 bad input.",
    )
    p.add_argument("--gpu", required=True, metavar="MODEL",
                   help=f"GPU model (accepted: {mig.accepted_models_text()})")
    p.add_argument("--existing", action="append", default=[], metavar="PROFILE@START",
                   help="a slice already on the GPU (repeatable; also comma-separated or bare PROFILE@START "
                        "arguments); START is the first memory slice, as nvidia-smi mig -lgi shows it")
    p.add_argument("profiles", nargs="*", metavar="PROFILE", help="profiles to place")
    return p


def _parse_existing(geom: mig.Geometry, items: Sequence[str]) -> list[mig.Placement]:
    out = []
    for item in items:
        for part in (x.strip() for x in item.split(",")):
            if not part:
                continue
            name, at, start = part.rpartition("@")
            if not at or not name.strip():
                raise _Usage(f"--existing {part!r}: expected PROFILE@START, e.g. 1g.10gb@6")
            try:
                first = int(start)
            except ValueError:
                raise _Usage(f"--existing {part!r}: START must be a memory-slice index, e.g. 1g.10gb@6") from None
            out.append(mig.slice_at(geom, name.strip(), first))
    return out


def _describe(layout: Sequence[mig.Placement]) -> str:
    return ", ".join(f"{p.profile}@{p.start}" for p in layout) or "nothing"


def main(argv: Sequence[str] | None = None, *, prog: str = "gpuops mig plan",
         stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    parser = build_parser(prog)
    try:
        try:
            args = parser.parse_intermixed_args(argv)
        except SystemExit as e:  # --help
            return e.code if isinstance(e.code, int) else 0
        # A bare PROFILE@START is an existing slice (a request never contains "@").
        existing_args = [*args.existing, *(x for x in args.profiles if "@" in x)]
        requests = [x for x in args.profiles if "@" not in x]
        if not requests:
            raise _Usage("give at least one PROFILE to place, e.g. 1g.10gb")
        geom = mig.geometry(args.gpu)
        existing = mig.check_layout(geom, _parse_existing(geom, existing_args))
        placed = mig.place(geom, existing, requests)
    except _Usage as e:
        parser.print_usage(err)
        print(f"{prog}: error: {e}", file=err)
        return 2
    except AccountingError as e:
        print(f"{prog}: error: {e}", file=err)
        return 2
    if placed is None:
        free = mig.free_capacity(geom, existing)
        print(
            f"{prog}: {' + '.join(mig.parse_profile(geom, r).name for r in requests)} does not fit on {geom.model} "
            f"holding {_describe(existing)}: no valid layout holds them all, in any order. Still free "
            f"(how many of each alone): {', '.join(f'{k} x{v}' for k, v in free.items() if v) or 'nothing'}.",
            file=err,
        )
        return 1
    print(json.dumps([{"profile": p.profile, "start": p.start, "size": p.size} for p in placed]), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
