"""kill -9 of the operator (allocator + webhook) while MIG pods are gated, then a restart.

Rig (chaos/_migslicer.py): 3 MIG nodes x 2 A100-40GB (48 memory slices), agents keep running throughout. Two
rounds, each a burst of pods asking for more than the cluster holds (the rest must wait with a reason until
earlier pods finish), the operator killed (SIGKILL, from a synchronous store listener, so the kill lands on the
very write that triggers it; armed once the whole burst is admitted, since the webhook dies with the operator)
and restarted after a downtime:
  planning   killed once K pods have claims: some pods planned (claims Pending, maybe only part of a
             multi-slice pod's claims), some not planned at all;
  ungating   killed when an agent reports a claim advertised for a still-gated pod: the allocator's next step
             (the ungate) never ran.
Checked: every pod runs in the end (or, while capacity is short, waits gated with MigSlices=False and a
reason), no pod ever holds more live claims than slices nor two live claims a memory slice (checked on every
claim change), no pod handed another pod's slice, and the two global checks (no pod gated without a reason;
no slice without a live claim once the pods are done and the grace passed). Reported: claims created vs slices
asked (a restart that finds a partly written plan deletes it and plans again), restart -> first ungate,
restart -> every planned pod running.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from _common import Detail, Figures, Found, Report, mode_of, run_scenario, wait_for
from _migslicer import COMMON_NOTES, ClaimRecord, MigRig, PodRecord, is_gated, open_mig_rig, pace

NAME = "migslicer_operator_restart"
NOTES = {
    "pods_partly_planned_at_kill": "gated pods with fewer live claims than slices at the kill (a plan cut short)",
    "pods_all_created_at_restart": "pods whose every slice the agents made while the operator was down",
    "replans": "allocator 'replanning pod' records (a partly written plan found after the restart is redone)",
    "restart_to_first_ungate_max_s": "operator restart -> first pod ungated (worst round)",
    "restart_to_planned_running_max_s": "operator restart -> every pod planned before it Running (worst round)",
    "kill_to_all_running_max_s": "kill -> every pod of the round Running, waits for capacity included",
}

SHAPES = [["3g.20gb"], ["2g.10gb"], ["1g.10gb", "1g.5gb"], ["3g.20gb"], ["2g.10gb", "2g.10gb"]]


async def one_round(mr: MigRig, n: int, kind: str, *, pods: int, runtime: float, down: float,
                    trigger_pods: int) -> dict[str, Any]:
    info: dict[str, Any] = {"round": n, "kind": kind, "pods": pods}
    names = [f"r{n}-p{i}" for i in range(pods)]
    uids: set[str] = set()
    killed: list[float] = []
    burst_done: list[bool] = []  # armed once the whole burst is admitted (the webhook dies with the operator)

    def hook(kind_: str, rec: Any) -> None:
        if killed or not burst_done:
            return
        if kind_ == "pod" and isinstance(rec, PodRecord) and rec.name in names:
            uids.add(rec.uid)
            return
        if not isinstance(rec, ClaimRecord) or rec.pod_uid not in uids:
            return
        if kind == "planning":
            hit = len({c.pod_uid for c in mr.track.claims.values() if c.pod_uid in uids}) >= trigger_pods
        else:
            pod = mr.track.pods.get(rec.pod_uid)
            hit = bool((rec.last.get("status") or {}).get("advertised")) and pod is not None and is_gated(pod.last)
        if hit:
            mr.rig.kill()
            killed.append(time.monotonic())

    mr.track.hooks.append(hook)
    try:
        for i, name in enumerate(names):
            await mr.create_pod(mr.pod_body(name, SHAPES[i % len(SHAPES)], runtime=runtime))
        uids.update(r.uid for x in names if (r := mr.track.pod(x)) is not None)
        burst_done.append(True)
        planned = {c.pod_uid for c in mr.track.claims.values() if c.pod_uid in uids}
        if kind == "planning" and len(planned) >= trigger_pods:
            mr.rig.kill()  # already past the trigger: kill now
            killed.append(time.monotonic())
        await wait_for(f"round {n}: the kill ({kind})", lambda: bool(killed), 30, every=0.01)
    finally:
        mr.track.hooks.remove(hook)
    recs = [r for x in names if (r := mr.track.pod(x)) is not None]

    def snapshot() -> dict[str, int]:
        gated = [r for r in recs if is_gated(r.last)]
        with_claims = [r for r in gated if any(c.live for c in mr.track.claims_of(r.uid))]
        partial = [r for r in with_claims if len([c for c in mr.track.claims_of(r.uid) if c.live]) < len(r.profiles)]
        created = [r for r in with_claims if all(c.phase == "Created" for c in mr.track.claims_of(r.uid) if c.live)]
        return {"gated": len(gated), "planned": len(with_claims), "partly_planned": len(partial),
                "all_created": len(created), "not_planned": len(gated) - len(with_claims),
                "no_capacity_reason": sum(1 for r in gated if r.reasons and r.reasons[-1] == "NoCapacity"),
                "running": sum(1 for r in recs if r.running_at is not None)}

    info["at_kill"] = snapshot()
    await pace(down)  # the agents go on making the Pending claims' slices; nothing ungates them
    info["at_restart"] = snapshot()
    planned_at_restart = [r for r in recs if is_gated(r.last) and any(c.live for c in mr.track.claims_of(r.uid))]
    restarted = time.monotonic()
    await mr.rig.start_operator()
    info["operator_up_s"] = round(time.monotonic() - restarted, 3)
    ran = await mr.wait_running([r.name for r in planned_at_restart], 60) if planned_at_restart else {}
    ungates = [r.ungated_at for r in recs if r.ungated_at is not None and r.ungated_at > restarted]
    info["restart_to_first_ungate_s"] = round(min(ungates) - restarted, 3) if ungates else None
    info["restart_to_planned_running_s"] = (
        round(max(mr.ran_at(x) for x in ran) - restarted, 3) if ran else None)
    # while capacity is short, the waiting pods must say why
    info["gated_offenders_after_restart"] = (await mr.check_gated(15))[0]
    await mr.wait_running(names, 120)
    info["kill_to_all_running_s"] = round(max(r.running_at for r in recs if r.running_at) - killed[0], 3)
    info["claims_created"] = sum(len(mr.track.claims_of(r.uid)) for r in recs)
    info["slices_asked"] = sum(len(r.profiles) for r in recs)
    return info


async def scenario(quick: bool) -> Found:
    problems: list[str] = []
    t0 = time.monotonic()
    pods, runtime, down = (16, 4.0, 2.0) if quick else (30, 8.0, 10.0)
    async with open_mig_rig(NAME, grace=3.0) as mr:
        results = [await one_round(mr, 1, "planning", pods=pods, runtime=runtime, down=down,
                                   trigger_pods=4 if quick else 8)]
        await mr.wait_admitting(30)
        results.append(await one_round(mr, 2, "ungating", pods=pods, runtime=runtime, down=down, trigger_pods=0))
        for r in results:
            problems += [f"round {r['round']}: after the restart, {g}" for g in r["gated_offenders_after_restart"]]

        def finished() -> bool:
            return all(r.terminal_at is not None for r in mr.track.pods.values())

        await wait_for("every pod finished", finished, 90)
        common = await mr.final_checks(problems)
        replans = mr.operator_log("replanning pod")
        figures: dict[str, Any] = {
            "rounds": len(results),
            "operator_kills": len(results),
            "pods_planned_at_kill": sum(r["at_kill"]["planned"] for r in results),
            "pods_partly_planned_at_kill": sum(r["at_kill"]["partly_planned"] for r in results),
            "pods_not_planned_at_kill": sum(r["at_kill"]["not_planned"] for r in results),
            "pods_all_created_at_restart": sum(r["at_restart"]["all_created"] for r in results),
            "replans": len(replans),
            "restart_to_first_ungate_max_s": max(r["restart_to_first_ungate_s"] or 0 for r in results),
            "restart_to_planned_running_max_s": max(r["restart_to_planned_running_s"] or 0 for r in results),
            "kill_to_all_running_max_s": max(r["kill_to_all_running_s"] for r in results),
            **common,
            "run_seconds": round(time.monotonic() - t0, 1),
        }
        return mr.verdict(figures, problems, rounds=results,
                          replan_reasons=sorted({str(e.get("reason")) for e in replans}))


def report(figures: Figures, detail: Detail, args: argparse.Namespace) -> Report:

    def snap(s: dict[str, int]) -> str:
        return f"{s['gated']} / {s['planned']} ({s['partly_planned']}) / {s['all_created']} / {s['not_planned']} / " \
               f"{s['running']}"

    rows = "\n".join(
        f"| {r['round']} | {r['kind']} | {r['pods']} | {snap(r['at_kill'])} | {snap(r['at_restart'])} | "
        f"{r['operator_up_s']} | {r['restart_to_first_ungate_s']} | {r['restart_to_planned_running_s']} | "
        f"{r['kill_to_all_running_s']} | {r['claims_created']}/{r['slices_asked']} |" for r in detail["rounds"])
    injected = "operator kill -9 while planning and before an ungate, with pods waiting for capacity; restart"
    checked = ("every pod runs, waiting pods carry a reason, never more live claims than slices, no shared "
               "slice, no leaked slice")
    key = (f"{figures['mig_pods_ran']}/{figures['mig_pods']} ran, {figures['claims_created']} claims for "
           f"{figures['slices_asked']} slices ({figures['replans']} replans), restart->1st ungate <= "
           f"{figures['restart_to_first_ungate_max_s']} s, {figures['leaked_slices_at_end']} leaked")
    md = f"""# MIG slicer: operator kill -9 with gated pods ({mode_of(args)} run)

Each round a burst of pods ({', '.join('+'.join(s) for s in SHAPES)}, cycled) asking for more than the
48 memory slices of the 3 nodes; the operator killed by a store listener (round 1: once pods have claims;
round 2: when a claim of a gated pod is reported advertised, before its ungate) and restarted after the
downtime. Agents run throughout. Snapshot columns: gated / planned (partly) / all slices Created /
not planned / running. Replan reasons: {', '.join(detail['replan_reasons']) or 'none'}.

| round | kill at | pods | at kill | at restart | operator up (s) | restart -> 1st ungate (s) | \
restart -> planned Running (s) | kill -> all Running (s) | claims / slices |
|---|---|---|---|---|---|---|---|---|---|
{rows}"""
    return Report(md, COMMON_NOTES | NOTES, listed=True, injected=injected, checked=checked, key=key)


if __name__ == "__main__":
    run_scenario(NAME, __doc__, lambda args: scenario(args.quick), report)
