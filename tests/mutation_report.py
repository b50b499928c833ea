"""The mutation score of `make mutation`'s last run, per file, and its surviving mutants with their diffs.

Reads mutmut's result files (mutants/**/*.py.meta: an exit code per mutant; 1 or 3 = a test failed, the mutant is
killed; 0 = every selected test passed, it survived; 33 = no test covers it; 34/36/-24 = timeout or killed by a
signal, counted as killed, as mutmut does) and asks `mutmut show` for each survivor's diff.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "mutants"
KILLED = {1, 3, 34, 36, -24, -9, 152}


def outcome(code: int | None) -> str:
    if code is None:
        return "not run"
    if code == 0:
        return "survived"
    if code == 33:
        return "no tests"
    return "killed" if code in KILLED else f"exit {code}"


def _functions(codes: dict[str, int | None]) -> dict[str, Counter[str]]:
    """Outcomes per mutated function, for the functions of which at least one mutant ran."""
    out: dict[str, Counter[str]] = {}
    for key, code in codes.items():
        if code is not None:
            function = re.sub(r"__mutmut_\d+$", "", key).replace("ǁ", ".").replace(".x_", ".").replace(".x.", ".")
            out.setdefault(function, Counter())[outcome(code)] += 1
    return out


def main() -> int:
    metas = sorted(MUTANTS.glob("**/*.py.meta"))
    if not metas:
        print("no mutmut results in mutants/: run `make mutation` first", file=sys.stderr)
        return 1
    survivors: list[str] = []
    by_function: dict[str, Counter[str]] = {}
    print("| file | killed | survived | no tests | not run | score (killed / run) |\n|---|---|---|---|---|---|")
    for meta in metas:
        codes: dict[str, int | None] = json.loads(meta.read_text()).get("exit_code_by_key", {})
        tally = Counter(outcome(c) for c in codes.values())
        run = tally["killed"] + tally["survived"] + tally["no tests"]
        score = f"{tally['killed'] / run:.1%}" if run else "-"
        name = str(meta.relative_to(MUTANTS))[: -len(".meta")]
        print(f"| `{name}` | {tally['killed']} | {tally['survived']} | {tally['no tests']} | {tally['not run']} "
              f"| {score} |")
        survivors += [k for k, c in codes.items() if outcome(c) in ("survived", "no tests")]
        by_function.update(_functions(codes))
    print("\n| function | killed | survived | score |\n|---|---|---|---|")
    for function, tally in sorted(by_function.items()):
        run = tally["killed"] + tally["survived"] + tally["no tests"]
        print(f"| `{function}` | {tally['killed']} | {tally['survived'] + tally['no tests']} "
              f"| {tally['killed'] / run:.1%} |")
    mutmut = ROOT / ".venv" / "bin" / "mutmut"
    for name in survivors:
        print(f"\n### {name}\n")
        shown = subprocess.run([str(mutmut), "show", name], capture_output=True, text=True, cwd=ROOT)
        print("```diff\n" + shown.stdout.strip() + "\n```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
