"""The cloud API failing 20 % of calls while a spot pool scales up, down and loses instances to reclaims.

Injected on the emulated cloud's spot API (run, describe, terminate), from before the pool exists to after
it is deleted: HTTP 500 and 503 before the operation, 429 RequestLimitExceeded (Retry-After 1 s) before it,
HTTP 502 *after* it took effect (the answer lost on the way back), and a hang after it took effect that
outlasts the provider's 15 s call timeout (16 s; the operator sees a timeout for a call that did happen).
The hang is rarer (2 % of calls; `--quick`: at most 2 of them) so the run keeps its size; the five rules
together fail ~20 % of calls. On top, the first two RunInstances answers are lost (502 after the launch),
so a retried launch meets its own client token whatever the random draws.

Rig (chaos/_spotpool.py): `--spotpool-resync 2`, reclaim notice 5 s. Phases (after the creation, a cycle
repeated once with `--quick`, six times in full), each ending when the pool
is at its target (`SpotRig.converged`; without scaleOnDemand the target is the live count clamped to
[minimum, maximum], so lowering 6 / 8 to 2 / 3 retires down to 3): minimum 3 / maximum 5; up to 8 / 10
(`--quick`: 6 / 8); two instances reclaimed; down to 2 / 3 (scale-in: drain, terminate); full run only:
up again to 6 / 8 with two reclaims at once, down to 3 / 5. Then the pool is deleted (deletionPolicy Terminate) with the
faults still on.

Checked: every 50 ms, live instances of the pool (pending or running, not under a reclaim notice, from the
cloud's records) <= the maximum in force (after the maximum is lowered, the bound follows the live count
down and never lets it rise again until it reaches the new maximum); each phase converges; after deletion the
pool object is gone and no instance carrying its tag is left pending or running (all terminated).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from _common import Detail, Figures, Found, Report, mode_of, run_scenario, wait_for
from _spotpool import SpotRig, bench, open_spot_rig

NAME = "spotpool_provider_faults"
NOTES = {
    "failure_fraction": "spot API requests not answered 2xx (hangs end in 504 after the operator gave up)",
    "samples_above_maximum": "50 ms samples with live instances above the bound in force (must be 0)",
    "leaked_instances": "tagged instances pending/running after the pool was deleted (must be 0)",
    "launch_calls_replayed": "RunInstances calls answered from the client token (a retry of a launch that happened)",
    "client_tokens_creating": "client tokens that created instances",
}

TOTAL = 0.20
HANG_RATE = 0.02
HANG_SECONDS = 16.0
OTHER_RATE = 1 - ((1 - TOTAL) / (1 - HANG_RATE)) ** 0.25  # four more rules: 20 % of calls fail in all


def inject(sr: SpotRig, quick: bool) -> None:
    f = sr.cluster.cloud.faults
    f.add(api="spot", status=500, rate=OTHER_RATE)
    f.add(api="spot", status=503, rate=OTHER_RATE)
    f.add(api="spot", status=429, error="RequestLimitExceeded", rate=OTHER_RATE)
    f.add(api="spot", status=502, rate=OTHER_RATE, after=True)  # BadGateway: the answer lost after the effect
    f.add(api="spot", hang=True, hang_seconds=HANG_SECONDS, rate=HANG_RATE, after=True, count=2 if quick else None)
    # launches are few (one per scale-up or reclaim): the first two answers are lost for certain, so the case
    # client tokens exist for is exercised whatever the draws
    f.add(api="spot", op="run", status=502, after=True, count=2)


class Ceiling:
    """The bound on live instances: the maximum in force, or after it was lowered, the live count's running
    minimum until that reaches the new maximum (retiring takes a drain; it must never go back up)."""

    def __init__(self, maximum: int) -> None:
        self.bound = maximum
        self.maximum = maximum
        self.violations: list[tuple[float, int, int]] = []
        self.peak = 0

    def set_maximum(self, maximum: int, live: int) -> None:
        self.bound = maximum if maximum >= self.maximum else max(maximum, min(self.bound, live))
        self.maximum = maximum

    def check(self, now: float, live: int) -> None:
        self.peak = max(self.peak, live)
        if live > self.bound:
            self.violations.append((now, live, self.bound))
        elif live < self.bound:
            self.bound = max(self.maximum, live)


async def phase(sr: SpotRig, ceiling: Ceiling, name: str, t0: float, log: list[dict[str, Any]], within: float,
                minimum: int | None = None, maximum: int | None = None, reclaim: int = 0) -> None:
    """Change the bounds and/or reclaim, then wait for the pool at its target: without scaleOnDemand, the live
    count clamped to [minimum, maximum] (the plan's documented rule; reclaimed instances do not count)."""
    start = time.monotonic()
    live = len(sr.led.live())
    spec = sr.spec()
    lo = int(spec.get("minimum") or 0) if minimum is None else minimum
    hi = int(spec.get("maximum") or 0) if maximum is None else maximum
    target = min(max(live - reclaim, lo), hi)
    if minimum is not None and maximum is not None:
        if maximum < ceiling.maximum:
            ceiling.set_maximum(maximum, len(sr.led.live()))
            await sr.patch_spec(minimum=minimum, maximum=maximum)
        else:
            await sr.patch_spec(maximum=maximum, minimum=minimum)  # a merge patch: both land in one write
            ceiling.set_maximum(maximum, len(sr.led.live()))
    ids: list[str] = []
    if reclaim:
        cands = sorted((i for i in sr.led.ready() if i.interruption is None), key=lambda i: (i.launch_time, i.id))
        ids = sr.cluster.cloud.reclaim([i.id for i in cands[:reclaim]], notice_seconds=5.0)
    done = await sr.wait_converged(f"phase {name}: converged at {target}", within, target)
    log.append({"phase": name, "at": round(start - t0, 3), "converged_after_s": round(done - start, 3),
                "target": target, "reclaimed": ids, "minimum": sr.spec().get("minimum"),
                "maximum": sr.spec().get("maximum")})


async def scenario(quick: bool, seed: int) -> Found:
    problems: list[str] = []
    phases: list[dict[str, Any]] = []
    up_min, up_max = (6, 8) if quick else (8, 10)
    within = 45.0 if quick else 60.0  # per phase: a hang costs 15 s of it
    cycles = 1 if quick else 6
    async with open_spot_rig("chaos-spot-faults", seed=seed, resync=2, notice=5.0, minimum=3) as sr:
        inject(sr, quick)
        ceiling = Ceiling(5)
        stop = asyncio.Event()
        t0 = time.monotonic()
        sr.led.start(t0)
        sampler = asyncio.create_task(sr.led.sample(stop, check=lambda now: ceiling.check(now, len(sr.led.live()))))
        gone_at: float | None = None
        try:
            await sr.create_pool(3, 5)
            await phase(sr, ceiling, "create 3/5", t0, phases, within)
            for c in range(cycles):
                await phase(sr, ceiling, f"c{c} up {up_min}/{up_max}", t0, phases, within, up_min, up_max)
                await phase(sr, ceiling, f"c{c} reclaim 2", t0, phases, within, reclaim=2)
                await phase(sr, ceiling, f"c{c} down 2/3", t0, phases, within, 2, 3)
                if not quick:
                    await phase(sr, ceiling, f"c{c} up 6/8 + reclaim 2", t0, phases, within, 6, 8, reclaim=2)
                    await phase(sr, ceiling, f"c{c} down 3/5", t0, phases, within, 3, 5)
            deleted = time.monotonic()
            await sr.delete_pool()
            await wait_for("the pool object gone", lambda: sr.pool() is None, within)
            gone_at = time.monotonic()
            await wait_for("every tagged instance terminated",
                           lambda: all(i.state == "terminated" for i in sr.tagged()), 30)
            phases.append({"phase": "delete", "at": round(deleted - t0, 3),
                           "converged_after_s": round(gone_at - deleted, 3)})
        except TimeoutError as e:
            st = sr.status()
            problems.append(f"{e} (status size {st.get('size')}, ready {st.get('ready')}, pendingLaunch "
                            f"{st.get('pendingLaunch')}, lastError {st.get('lastError')!r}, live {len(sr.led.live())})")
        finally:
            sr.led.finish(time.monotonic())
            stop.set()
            await sampler
        leaked = [i.id for i in sr.tagged() if i.state in ("pending", "running")]
        unterminated = [f"{i.id}:{i.state}" for i in sr.tagged() if i.state != "terminated"]
        if gone_at is not None and leaked:
            problems.append(f"instances left pending/running after the pool was deleted: {leaked}")
        if ceiling.violations:
            v = ceiling.violations
            problems.append(f"live instances above the maximum in force: {len(v)} samples, first at "
                            f"{v[0][0] - t0:.2f} s ({v[0][1]} > {v[0][2]}), peak {max(x[1] for x in v)}")
        calls = sr.cluster.cloud.calls
        spot_calls = sum(n for (a, _, _), n in calls.items() if a == "spot")
        failed = sum(n for (a, _, s), n in calls.items() if a == "spot" and not 200 <= s < 300)
        injected = sr.cluster.cloud.faults.injected
        if not injected:
            problems.append("no fault was injected: the scenario tested nothing")
        figures: dict[str, float | int] = {
            "spot_calls": spot_calls, "spot_calls_failed": failed,
            "failure_fraction": round(failed / spot_calls, 3) if spot_calls else 0.0,
            "faults_injected": sum(injected.values()),
            "hangs_injected": sum(n for (_, _, f), n in injected.items() if f == "hang"),
            "instances_created": sr.led.created(), "reclaimed": len(sr.led.noticed),
            "max_live_not_noticed": ceiling.peak, "samples_above_maximum": len(ceiling.violations),
            "leaked_instances": len(leaked), "unterminated_at_end": len(unterminated),
            "launch_calls": len(sr.led.launches), "launch_calls_replayed": sum(1 for c in sr.led.launches
                                                                              if not c.created),
            "client_tokens_creating": len({c.token for c in sr.led.launches if c.created}),
            "phases_converged": sum(1 for p in phases if p["phase"] != "delete"),
            "seconds_to_pool_gone": next((p["converged_after_s"] for p in phases if p["phase"] == "delete"), -1),
        }
        rules = sr.cluster.cloud.faults.describe()
        for (_, op, fault), n in sorted(injected.items()):
            key = f"injected_{op}_{fault}"
            figures[key] = int(figures.get(key, 0)) + n
        conv = [p["converged_after_s"] for p in phases if p["phase"] != "delete"]
        figures["phase_converged_p50_s"] = bench.pct(conv, 0.5) or -1
        figures["phase_converged_max_s"] = max(conv, default=-1)
        detail = {"problems": problems, "phases": phases, "cloud_faults": rules,
                  "unterminated": unterminated,
                  "launches": sr.launches_since(t0),
                  "rates": {"other_rules": round(OTHER_RATE, 4), "hang": HANG_RATE, "hang_seconds": HANG_SECONDS}}
        return figures, detail, not problems


def report(figures: Figures, detail: Detail, args: argparse.Namespace) -> Report:
    rows = "\n".join(f"| {p['phase']} | {p['at']} | {p.get('target', '-')} | {p['converged_after_s']} | "
                     f"{len(p.get('reclaimed') or [])} |"
                     for p in detail["phases"])
    r = detail["rates"]
    injected = ("spot API: 500/503/429 before, 502 after, hangs > call timeout after; ~20 % of calls; "
                "scale up/down, reclaims, deletion")
    checked = "live <= maximum (50 ms samples), every phase converges, 0 leaked after deletion"
    key = (f"{figures['spot_calls']} calls, {figures['failure_fraction']:.0%} failed, "
           f"{figures['hangs_injected']} hangs; peak live {figures['max_live_not_noticed']}, "
           f"{figures['samples_above_maximum']} samples above max, {figures['leaked_instances']} leaked")
    md = f"""# Spot pool: the cloud API failing 20 % of calls ({mode_of(args)} run)

Injected on the emulated spot API (run, describe, terminate): 500 / 503 / 429 RequestLimitExceeded before the
operation and 502 after it took effect ({r['other_rules']:.1%} of calls each), a hang after it took effect for
{r['hang_seconds']:g} s, past the provider's 15 s call timeout ({r['hang']:.0%}). The pool scales up, loses
instances to reclaims, scales down, and is deleted with the faults on (`--spotpool-resync 2`).

Checked: live instances (pending/running, not under notice) <= the maximum in force, every 50 ms; every
phase converges (its target Ready, status agrees, no launch pending); after deletion no tagged instance pending
or running.

| phase | started (s) | target | converged after (s) | reclaimed |
|---|---|---|---|---|
{rows}"""
    return Report(md, NOTES, injected=injected, checked=checked, key=key)


if __name__ == "__main__":
    run_scenario(NAME, __doc__, lambda args: scenario(args.quick, args.seed), report)
