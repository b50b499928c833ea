"""kill -9 of the operator between the cloud's launch and the pool's status write, several times.

Rig (chaos/_spotpool.py): `--spotpool-resync 2`. A fault rule on the emulated cloud holds every RunInstances
answer for 3 s *after* the launch took effect (`after=True`, `delay=3`): the instances exist, the operator
has not heard. A watcher polls `cloud.spot.launched` every 10 ms and kills the operator (SIGKILL) as soon as
it rises, then restarts it. Each round needs exactly one thing (round 1: create the pool, minimum 3; then in
turn: one instance reclaimed (notice 4 s), the minimum raised by one); rounds: 3 (`--quick`) or 6.

Checked per round and overall, from the cloud's own records: the kill landed inside the held answer (before
the operator could log the launch); the persisted `status.pendingLaunch.clientToken` at the kill is the
token of the instances created; instances created == what the round needed (no duplicate); tokens that
created instances == launch intents (`status.launchSequence`); the pool at its minimum Ready after each
restart. Reported: how the restarted operator settled the intent (re-sent the same token and got the
cloud's replay, or found the instances by their launch-id tag).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from _common import Detail, Figures, Found, Report, mode_of, run_scenario, wait_for
from _spotpool import SpotRig, open_spot_rig, sleep_until

NAME = "spotpool_operator_kill"
NOTES = {
    "instances_created": "instances the cloud created (replays of a token create none)",
    "duplicates": "created beyond what the rounds needed (must be 0)",
    "tokens_creating_instances": "client tokens that created instances (must equal launch_intents)",
    "launch_intents": "status.launchSequence: launch intents the operator persisted",
    "tokens_reused_after_restart": "rounds where the token persisted at the kill is the one that bought",
    "rounds_settled_by_replay": "rounds where the new process re-sent the token (the rest found the instances by tag)",
    "restart_to_converged_max_s": "restart -> pool at its minimum Ready (worst round)",
}

HOLD = 3.0
START_MIN, MAXIMUM = 3, 10


async def one_round(sr: SpotRig, n: int, kind: str, problems: list[str]) -> dict[str, Any]:
    spot = sr.spot
    before_launched = spot.launched
    before_calls = len(sr.led.launches)
    seq_before = int(sr.status().get("launchSequence") or 0)
    minimum = int(sr.spec().get("minimum") or 0)
    info: dict[str, Any] = {"round": n, "kind": kind}
    killed = asyncio.Event()

    async def watch() -> None:
        await wait_for("the cloud's launched counter to rise", lambda: spot.launched != before_launched, 30,
                       every=0.01)
        sr.rig.kill()
        first = next((c for c in sr.led.launches[before_calls:] if c.created), None)
        info["kill_after_launch_s"] = round(time.monotonic() - first.at, 3) if first is not None else None
        info["killed_token"] = first.token if first is not None else None
        killed.set()

    watcher = asyncio.create_task(watch())
    if kind == "create":
        need = START_MIN
        await sr.create_pool(START_MIN, MAXIMUM)
    elif kind == "reclaim":
        need = 1
        victim = sorted((i for i in sr.led.ready() if i.interruption is None), key=lambda i: i.launch_time)[0]
        sr.cluster.cloud.reclaim([victim.id], notice_seconds=4.0)
    else:
        need = 1
        await sr.patch_spec(minimum=minimum + 1)
    info["need"] = need
    try:
        await asyncio.wait_for(killed.wait(), 31)
    except TimeoutError:
        watcher.cancel()
        problems.append(f"round {n} ({kind}): no launch within 30 s")
        return info
    pl = sr.status().get("pendingLaunch") or {}
    token = info["killed_token"]
    info["persisted_token"] = pl.get("clientToken")
    if pl.get("clientToken") != token:
        problems.append(f"round {n}: the status at the kill persisted token {pl.get('clientToken')!r}, the cloud "
                        f"created instances for {token!r}")
    if info["kill_after_launch_s"] is None or info["kill_after_launch_s"] >= HOLD:
        problems.append(f"round {n}: the kill missed the held answer ({info['kill_after_launch_s']} s after launch)")
    restart = time.monotonic()
    await sr.rig.start_operator()
    info["restart_to_metrics_s"] = round(time.monotonic() - restart, 3)
    try:
        done = await sr.wait_converged(f"round {n}: the pool at its minimum Ready after the restart", 60)
        info["restart_to_converged_s"] = round(done - restart, 3)
    except TimeoutError as e:
        problems.append(f"{e} (status size {sr.status().get('size')}, ready {sr.status().get('ready')}, live "
                        f"{len(sr.led.live())})")
    calls = sr.led.launches[before_calls:]
    created_tokens = {c.token for c in calls if c.created}
    info["created"] = spot.launched - before_launched
    info["run_calls"] = len(calls)
    info["tokens_creating"] = len(created_tokens)
    info["replayed_after_restart"] = sum(1 for c in calls if not c.created and c.token == token)
    info["launch_intents"] = int(sr.status().get("launchSequence") or 0) - seq_before
    logged = [r for r in sr.operator_log("instances launched") if r.get("token") == token]
    info["launch_logged_by_killed_process"] = sum(1 for r in logged if r["start"] == sr.rig.starts - 1)
    info["settled_by"] = "replay of the same token" if info["replayed_after_restart"] else "describe by launch-id tag"
    if info["created"] != need:
        problems.append(f"round {n} ({kind}): {info['created']} instances created for a need of {need}")
    if info["tokens_creating"] != info["launch_intents"]:
        problems.append(f"round {n}: {info['tokens_creating']} tokens created instances for "
                        f"{info['launch_intents']} launch intents")
    if info["launch_logged_by_killed_process"]:
        problems.append(f"round {n}: the killed process logged the launch: the kill came after the answer")
    return info


async def scenario(quick: bool, seed: int) -> Found:
    rounds = 3 if quick else 6
    kinds = ["create", *(("reclaim", "raise")[i % 2] for i in range(rounds - 1))]
    problems: list[str] = []
    results: list[dict[str, Any]] = []
    async with open_spot_rig("chaos-spot-kill", seed=seed, resync=2, notice=4.0, minimum=START_MIN) as sr:
        sr.cluster.cloud.faults.add(api="spot", op="run", delay=HOLD, after=True)
        for n, kind in enumerate(kinds, 1):
            results.append(await one_round(sr, n, kind, problems))
            if problems:
                break
        # after the last round: nothing more is bought while the pool sits at minimum (a fixed observation
        # window of three resyncs, each of which describes and plans again)
        quiet_from = sr.spot.launched
        await sleep_until(time.monotonic() + 3 * sr.resync)
        if sr.spot.launched != quiet_from:
            problems.append(f"{sr.spot.launched - quiet_from} instances launched while the pool was at minimum")
        st = sr.status()
        need = sum(r.get("need", 0) for r in results)
        created_tokens = {c.token for c in sr.led.launches if c.created}
        figures: dict[str, float | int] = {
            "rounds": len(results), "kills": sum(1 for r in results if "killed_token" in r),
            "instances_needed": need, "instances_created": sr.spot.launched,
            "duplicates": max(0, sr.spot.launched - need),
            "tokens_creating_instances": len(created_tokens),
            "launch_intents": int(st.get("launchSequence") or 0),
            "tokens_reused_after_restart": sum(1 for r in results if r.get("killed_token") == r.get("persisted_token")),
            "rounds_settled_by_replay": sum(1 for r in results if r.get("replayed_after_restart")),
            "final_minimum": int(sr.spec().get("minimum") or 0), "final_ready": int(st.get("ready") or 0),
            "final_live": len(sr.led.live()),
            "restart_to_converged_max_s": max((r.get("restart_to_converged_s", -1) for r in results), default=-1),
        }
        if figures["instances_created"] != need:
            problems.append(f"{figures['instances_created']} instances created in all for {need} needed")
        if figures["tokens_creating_instances"] != figures["launch_intents"]:
            problems.append(f"{figures['tokens_creating_instances']} tokens created instances for "
                            f"{figures['launch_intents']} launch intents")
        if figures["final_live"] != figures["final_minimum"]:
            problems.append(f"{figures['final_live']} live instances at the end for minimum {figures['final_minimum']}")
        return figures, {"problems": problems, "rounds": results,
                         "timings": {"held_answer_seconds": HOLD, "resync_seconds": sr.resync}}, not problems


def report(figures: Figures, detail: Detail, args: argparse.Namespace) -> Report:
    columns = ("round", "kind", "need", "created", "kill_after_launch_s", "killed_token", "persisted_token",
               "settled_by", "restart_to_converged_s")  # a round cut short lacks its later values: "-"
    rows = "\n".join("| " + " | ".join(str(r.get(c, "-")) for c in columns) + " |" for r in detail["rounds"])
    injected = (f"kill -9 while RunInstances' answer is held {HOLD:g} s after it took effect; restart; "
                f"{figures['rounds']} rounds (create, reclaim, raise minimum)")
    checked = "created == needed, one token per launch intent, persisted token reused, minimum Ready"
    key = (f"{figures['kills']} kills, {figures['instances_created']}/{figures['instances_needed']} created/"
           f"needed, {figures['tokens_creating_instances']} tokens for {figures['launch_intents']} intents")
    md = f"""# Spot pool: operator kill -9 between the launch and the status write ({mode_of(args)} run)

Every RunInstances answer held {HOLD:g} s after the launch took effect; the operator killed (SIGKILL) as soon as
the cloud's launched counter rises, then restarted (`--spotpool-resync 2`). Rounds: create (minimum {START_MIN}),
then alternately one instance reclaimed and the minimum raised by one.

Checked: instances created == needed, tokens that created instances == launch intents, the token persisted
at the kill is the one that bought, the kill inside the held answer, the pool at minimum Ready after each
restart, nothing bought while it then sits at minimum.

| round | kind | needed | created | kill after launch (s) | token of the launch | token persisted | \
settled by | restart -> converged (s) |
|---|---|---|---|---|---|---|---|---|
{rows}"""
    return Report(md, NOTES, injected=injected, checked=checked, key=key)


if __name__ == "__main__":
    run_scenario(NAME, __doc__, lambda args: scenario(args.quick, args.seed), report)
