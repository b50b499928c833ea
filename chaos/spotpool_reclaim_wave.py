"""A reclaim wave: the cloud takes 30 % of a spot pool at once.

Rig (chaos/_spotpool.py): a SpotPool of minimum 20, maximum 22 (`--quick`: 10 / 11), default
`--spotpool-resync` (30 s: replacements must come from the node agent's annotations and the describe they
trigger, not from polling). Reclaim notice 20 s (`--quick` 6 s), the node agent reports it within 1 s
(`--quick` 0.5 s). Once the pool is at its minimum, 30 % of its instances (seeded choice) get a notice in
one call; the full run repeats the wave once the pool is back.

Checked, from the emulated cloud's and the store's records (bench/spotpool.py `SpotLedger`): every reclaimed
instance replaced (a new instance created after its notice, first-come matching); the pool back at minimum
(as many live instances not under notice, all Ready, status size = ready = minimum, Ready=True, no launch
pending); live instances not under notice never above the maximum (sampled every 50 ms); no instance
created beyond minimum + reclaimed. Reported: replacement latency p50/p99 from the notice and from the
annotation, and the time back to minimum Ready.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

from _common import Detail, Figures, Found, Report, mode_of, run_scenario, wait_for
from _spotpool import SpotRig, bench, open_spot_rig

NAME = "spotpool_reclaim_wave"
NOTES = {
    "replacement_from_notice_p50_s": "cloud notice -> replacing instance created in the cloud",
    "replacement_from_annotation_p50_s": "node agent's annotation -> replacing instance created (negative: the "
                                         "replacement came first, from a describe another annotation triggered)",
    "replacement_within_1s_of_annotation": "share of reclaims replaced <= 1 s after their annotation",
    "samples_above_maximum": "50 ms samples with live instances not under notice > maximum (must be 0)",
    "duplicates": "instances created beyond minimum + reclaimed (must be 0)",
    "shortfall_instance_seconds": "max(0, minimum - Ready) integrated after the minimum was first Ready",
    "back_to_minimum_ready_s": "wave -> pool at minimum Ready again",
}

SHARE = 0.3


async def wave(sr: SpotRig, k: int, rng: random.Random, notice: float, problems: list[str]) -> dict[str, Any]:
    cands = sorted((i for i in sr.led.ready() if i.interruption is None), key=lambda i: (i.launch_time, i.id))
    victims = rng.sample(cands, k)
    t = time.monotonic()
    ids = sr.cluster.cloud.reclaim([i.id for i in victims], notice_seconds=notice)
    out: dict[str, Any] = {"reclaimed": ids}
    try:
        def replaced() -> bool:
            return all(r["launched"] is not None for r in sr.led.replacements())

        out["all_replacements_launched_s"] = round(await wait_for("every reclaimed instance replaced", replaced, 30)
                                                   - t, 3)
        back = await sr.wait_converged("the pool back at minimum Ready", 60)
        out["back_to_minimum_ready_s"] = round(back - t, 3)
    except TimeoutError as e:
        problems.append(f"{e} (status {sr.status().get('size')}/{sr.status().get('ready')}, "
                        f"live {len(sr.led.live())})")
    return out


async def scenario(quick: bool, seed: int) -> Found:
    minimum, maximum = (10, 11) if quick else (20, 22)
    notice, poll = (6.0, 0.5) if quick else (20.0, 1.0)
    waves = 1 if quick else 2
    k = round(minimum * SHARE)
    problems: list[str] = []
    over: list[tuple[float, int]] = []
    rng = random.Random(seed)
    async with open_spot_rig("chaos-spot-wave", seed=seed, notice=notice, notice_poll=poll,
                             minimum=minimum) as sr:
        def check(now: float) -> None:
            n = len(sr.led.live())
            if n > maximum:
                over.append((now, n))

        stop = asyncio.Event()
        t0 = time.monotonic()
        sr.led.start(t0)
        sampler = asyncio.create_task(sr.led.sample(stop, check=check))
        details: list[dict[str, Any]] = []
        try:
            await sr.create_pool(minimum, maximum)
            first = await sr.wait_converged(f"{minimum} Ready instances", 60)
            for _ in range(waves):
                details.append(await wave(sr, k, rng, notice, problems))
                if problems:
                    break
        except TimeoutError as e:
            problems.append(str(e))
            first = time.monotonic()
        finally:
            sr.led.finish(time.monotonic())
            stop.set()
            await sampler
        repl = sr.led.replacements()
        lat = bench.latency_figures(repl, "annotated")
        created = sr.led.created()
        reclaimed = len(sr.led.noticed)
        duplicates = max(0, created - (minimum + reclaimed))
        if lat["replaced"] != reclaimed:
            problems.append(f"{reclaimed - lat['replaced']} of {reclaimed} reclaimed instances never replaced")
        if over:
            problems.append(f"live instances not under notice above maximum {maximum}: {len(over)} samples, "
                            f"peak {max(n for _, n in over)}")
        if duplicates:
            problems.append(f"{duplicates} instances created beyond minimum + reclaimed")
        launched = sr.operator_log("instances launched")
        figures: dict[str, float | int] = {
            "minimum": minimum, "maximum": maximum, "waves": len(details), "reclaimed": reclaimed,
            "replaced": lat["replaced"],
            "replacement_from_notice_p50_s": lat["from_notice_p50_s"] if lat["from_notice_p50_s"] is not None else -1,
            "replacement_from_notice_p99_s": lat["from_notice_p99_s"] if lat["from_notice_p99_s"] is not None else -1,
            "replacement_from_annotation_p50_s": lat["from_annotation_p50_s"]
            if lat["from_annotation_p50_s"] is not None else -1,
            "replacement_from_annotation_p99_s": lat["from_annotation_p99_s"]
            if lat["from_annotation_p99_s"] is not None else -1,
            "replacement_within_1s_of_annotation": lat["within_1s_of_observable"],
            "notice_to_annotation_p50_s": lat["notice_to_annotation_p50_s"]
            if lat["notice_to_annotation_p50_s"] is not None else -1,
            "launch_calls_creating": sum(1 for c in sr.led.launches if c.created),
            "operator_launch_records": len(launched),
            "instances_created": created, "duplicates": duplicates,
            "max_live_not_noticed": sr.led.max_live_not_noticed, "samples_above_maximum": len(over),
            "shortfall_instance_seconds": round(sr.led.shortfall, 2),
            "seconds_to_first_minimum": round(first - t0, 3),
        }
        for i, d in enumerate(details):
            for key in ("all_replacements_launched_s", "back_to_minimum_ready_s"):
                if key in d:
                    figures[f"wave{i}_{key}"] = d[key]
        detail = {"problems": problems, "waves": details,
                  "replacements": [{k2: (round(v - t0, 3) if isinstance(v, float) else v) for k2, v in r.items()}
                                   for r in repl],
                  "launches": sr.launches_since(t0),
                  "timings": {"notice_seconds": notice, "notice_poll_seconds": poll, "resync_seconds": sr.resync}}
        return figures, detail, not problems


def report(figures: Figures, detail: Detail, args: argparse.Namespace) -> Report:
    t = detail["timings"]
    injected = (f"{SHARE:.0%} of a pool of {figures['minimum']} reclaimed at once ({figures['waves']} wave(s), "
                f"notice {t['notice_seconds']:g} s)")
    checked = "all replaced, back to minimum Ready, never above maximum, 0 duplicates"
    key = (f"replacement from notice p50/p99 {figures['replacement_from_notice_p50_s']:g}/"
           f"{figures['replacement_from_notice_p99_s']:g} s, from annotation p50/p99 "
           f"{figures['replacement_from_annotation_p50_s']:g}/{figures['replacement_from_annotation_p99_s']:g} s"
           f", duplicates {figures['duplicates']}")
    md = f"""# Spot pool: a reclaim wave takes 30 % of the pool ({mode_of(args)} run)

A pool of {figures['minimum']} (maximum {figures['maximum']}); {SHARE:.0%} of its instances get a reclaim notice in
one call ({figures['waves']} wave(s)); notice {t['notice_seconds']:g} s, node agent poll
{t['notice_poll_seconds']:g} s, `--spotpool-resync` {t['resync_seconds']:g} s (the default).

Checked: every reclaimed instance replaced; the pool back at minimum Ready; live instances not under notice
never above the maximum (50 ms samples); no instance beyond minimum + reclaimed."""
    return Report(md, NOTES, injected=injected, checked=checked, key=key)


if __name__ == "__main__":
    run_scenario(NAME, __doc__, lambda args: scenario(args.quick, args.seed), report)
