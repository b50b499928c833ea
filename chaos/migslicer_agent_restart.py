"""kill -9 of a node's MIG agent in the middle of making slices, then a restart.

Rig (chaos/_migslicer.py): 3 MIG nodes x 2 A100-40GB, operator and agents as processes, orphan grace 3 s.
Each round freezes one node's fake driver (its file lock held by the scenario), creates pods pinned to that node,
waits until the allocator has written all their claims (Pending), then lets the agent through one driver call
at a time until the state is the round's target, and kills the agent there (SIGKILL, lock still held):
  half-made   a GPU instance exists without its compute instance (the crash between NVML's two creates);
  unreported  a complete slice exists whose claim is still Pending (made, Created never written).
After a downtime the agent is restarted. Checked: every claim of the round reaches Created (the target slice
finished or adopted in place, not destroyed and made again), the pods run with exactly their claims' slices,
no claim re-planned, no pod ever holds more live claims than slices, and the two global checks (no pod gated
without a reason; no slice without a live claim once the pods are done and the grace passed).
Rounds: half-made, unreported (`--quick`); full adds a half-made round with a longer downtime and unpinned
pods created while the agent is down (the allocator may place them on the dead node: they wait for it).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from _common import Detail, Figures, Found, Report, mode_of, run_scenario, wait_for
from _migslicer import COMMON_NOTES, MigRig, open_mig_rig, pace

NAME = "migslicer_agent_restart"
NOTES = {
    "target_slices": "slices in the round's target state at the kill (half-made GI, or made but claim Pending)",
    "target_slices_kept": "of those, the same GPU instance serves the claim after the restart (finished/adopted)",
    "replans": "allocator 'replanning pod' records for the rounds' pods (0: no claim was abandoned)",
    "restart_to_all_created_max_s": "agent restart -> every claim of the round Created (worst round)",
    "kill_to_all_running_max_s": "kill -> every pod of the round Running (includes the downtime)",
}

ROUND_PODS = [["3g.20gb"], ["2g.10gb", "1g.5gb"], ["1g.10gb"], ["1g.5gb", "1g.5gb"]]


async def one_round(mr: MigRig, n: int, node: str, kind: str, *, runtime: float, down: float,
                    background: int, problems: list[str]) -> dict[str, Any]:
    info: dict[str, Any] = {"round": n, "node": node, "kind": kind}
    gate = mr.gate(node)
    await gate.hold()  # the driver hangs: the agent's next NVML call waits
    names = [f"r{n}-p{i}" for i in range(len(ROUND_PODS))]
    for name, profiles in zip(names, ROUND_PODS, strict=True):
        await mr.create_pod(mr.pod_body(name, profiles, runtime=runtime, node=node))

    def planned() -> bool:
        recs = [mr.track.pod(x) for x in names]
        return all(r is not None and len([c for c in mr.track.claims_of(r.uid) if c.live]) == len(r.profiles)
                   for r in recs)

    await wait_for(f"round {n}: claims for every pod", planned, 30)
    uids = {r.uid for x in names if (r := mr.track.pod(x)) is not None}
    round_claims = [c for c in mr.track.claims.values() if c.pod_uid in uids]
    info["claims"] = len(round_claims)

    def pending_at(gpu: str, start: int) -> bool:
        return any(c.gpu == gpu and c.start == start and c.phase == "Pending" for c in round_claims)

    if kind == "half-made":
        def target() -> bool:
            return any(cis == 0 and pending_at(g, s) for g, _, s, _, cis in gate.instances())
    else:
        def target() -> bool:
            return any(cis > 0 and pending_at(g, s) for g, _, s, _, cis in gate.instances())

    hit = await gate.step_until(target, 30)
    at_kill = gate.instances()
    mr.agents[node].kill()
    gate.release()
    killed = time.monotonic()
    info["target_reached"] = hit
    info["driver_steps"] = gate.steps
    info["kill_state"] = {"instances": len(at_kill),
                          "half_made": sum(1 for g, _, s, _, cis in at_kill if cis == 0 and pending_at(g, s)),
                          "complete_claim_pending": sum(1 for g, _, s, _, cis in at_kill
                                                        if cis > 0 and pending_at(g, s)),
                          "claims_pending": sum(1 for c in round_claims if c.phase == "Pending"),
                          "claims_created": sum(1 for c in round_claims if c.phase == "Created")}
    if not hit:
        problems.append(f"round {n}: the driver never showed the {kind} state in 30 s (killed anyway)")
    targets = {(g, s): gi for g, gi, s, _, cis in at_kill
               if pending_at(g, s) and (cis == 0) == (kind == "half-made")}

    bg = [f"r{n}-bg{i}" for i in range(background)]
    for name in bg:  # unpinned: the allocator does not know the node's agent is dead
        await mr.create_pod(mr.pod_body(name, ["1g.5gb"], runtime=runtime))
    await pace(down)
    info["deleted_while_down"] = sum(1 for c in round_claims if c.gone_at is not None)
    restarted = time.monotonic()
    info["agent_start_s"] = await mr.start_agent(node)

    def created() -> bool:
        return all(c.reached("Created") is not None for c in round_claims)

    t_created = await wait_for(f"round {n}: every claim Created after the restart", created, 40)
    # the layout right when every claim is Created, before a pod can finish and release its slice
    slices = {(s.gpu_uuid, s.start): s for s in await mr.driver(node)}
    ran = await mr.wait_running(names + bg, 60)
    info["restart_to_all_created_s"] = round(t_created - restarted, 3)
    info["kill_to_all_running_s"] = round(max(mr.ran_at(x) for x in names) - killed, 3)
    info["pod_start_s_max"] = max(ran.values())
    kept = sum(1 for key, gi in targets.items() if key in slices and slices[key].gpu_instance_id == gi)
    info["target_slices"] = len(targets)
    info["target_slices_kept"] = kept  # same GI id after the restart: finished/adopted, not destroyed and re-made
    if kept != len(targets):
        problems.append(f"round {n}: {len(targets) - kept} of {len(targets)} {kind} slice(s) were destroyed and made "
                        "again instead of finished/adopted")
    for x in names:
        r = mr.track.pod(x)
        assert r is not None
        made = mr.track.claims_of(r.uid)
        if len(made) != len(r.profiles):
            problems.append(f"round {n}: pod {x} got {len(made)} claims for {len(r.profiles)} slice(s) (re-planned)")
    replans = [e for e in mr.operator_log("replanning pod") if str(e.get("pod", "")).split("/")[-1] in names]
    info["replans"] = len(replans)
    return info


async def scenario(quick: bool) -> Found:
    problems: list[str] = []
    rounds = [("mig-0", "half-made"), ("mig-1", "unreported")] + ([] if quick else [("mig-2", "half-made")])
    runtime = 4.0 if quick else 8.0
    t0 = time.monotonic()
    async with open_mig_rig(NAME, grace=3.0) as mr:
        results = []
        for i, (node, kind) in enumerate(rounds, 1):
            long_round = not quick and i == len(rounds)
            results.append(await one_round(mr, i, node, kind, runtime=runtime, down=12.0 if long_round else 2.0,
                                           background=6 if long_round else 0, problems=problems))

        def finished() -> bool:
            return all(r.terminal_at is not None for r in mr.track.pods.values())

        await wait_for("every pod finished", finished, 60)
        common = await mr.final_checks(problems)
        figures: dict[str, Any] = {
            "rounds": len(results),
            "agent_kills": sum(a.kills for a in mr.agents.values()),
            "target_slices": sum(r["target_slices"] for r in results),
            "target_slices_kept": sum(r["target_slices_kept"] for r in results),
            "replans": sum(r["replans"] for r in results),
            "restart_to_all_created_max_s": max(r["restart_to_all_created_s"] for r in results),
            "kill_to_all_running_max_s": max(r["kill_to_all_running_s"] for r in results),
            **common,
            "run_seconds": round(time.monotonic() - t0, 1),
        }
        if figures["claims_created"] != figures["slices_asked"]:
            problems.append(f"{figures['claims_created']} claims created for {figures['slices_asked']} slices")
        return mr.verdict(figures, problems, rounds=results)


def report(figures: Figures, detail: Detail, args: argparse.Namespace) -> Report:
    rows = "\n".join(
        f"| {r['round']} | {r['node']} | {r['kind']} | {r['claims']} | {r['driver_steps']} | "
        f"{r['kill_state']['half_made']} / {r['kill_state']['complete_claim_pending']} / "
        f"{r['kill_state']['claims_pending']} | {r['target_slices_kept']}/{r['target_slices']} | "
        f"{r['agent_start_s']} | {r['restart_to_all_created_s']} | {r['kill_to_all_running_s']} | {r['replans']} |"
        for r in detail["rounds"])
    injected = f"agent kill -9 mid-creation ({', '.join(r['kind'] for r in detail['rounds'])}), restart"
    checked = ("claims Created in place, pods run with their slices, no re-plan/double claim, no gated pod "
               "without reason, no leaked slice")
    key = (f"{figures['target_slices_kept']}/{figures['target_slices']} target slices kept, "
           f"{figures['claims_created']} claims for {figures['slices_asked']} slices, "
           f"restart->Created <= {figures['restart_to_all_created_max_s']} s, "
           f"{figures['leaked_slices_at_end']} leaked")
    md = f"""# MIG slicer: node agent kill -9 while it makes slices ({mode_of(args)} run)

Each round: the node's fake driver frozen (its lock held by the scenario), 4 pods pinned to the node
({', '.join('+'.join(p) for p in ROUND_PODS)}), their claims written, then the agent let through one driver call
at a time and killed (SIGKILL) once the driver shows the round's state: a GPU instance without its compute
instance (half-made), or a complete slice whose claim is still Pending (unreported). Agent restarted after the
downtime.

| round | node | kind | claims | driver steps | at kill: half-made / made-unreported / claims Pending | \
target slices kept | agent start (s) | restart -> all Created (s) | kill -> all Running (s) | replans |
|---|---|---|---|---|---|---|---|---|---|---|
{rows}"""
    return Report(md, COMMON_NOTES | NOTES, listed=True, injected=injected, checked=checked, key=key)


if __name__ == "__main__":
    run_scenario(NAME, __doc__, lambda args: scenario(args.quick), report)
