"""A node's GPUs lose every MIG slice (a reboot) while pods run on it and others are being placed there.

Rig (chaos/_migslicer.py): 3 MIG nodes x 2 A100-40GB, orphan grace 3 s, heartbeat 2 s. Per round, on one node:
two long-running pods (3g.20gb; 2g.10gb+1g.5gb) run with their claims Bound; two more (1g.10gb; 1g.5gb) are
being placed: the driver is frozen (a store listener takes its lock) the moment their claims are all Created,
before the agent advertises them. Then the driver state is deleted under the lock (MIG instances do not
survive a reboot) and released:
  live-agent   mig-0: the agent keeps running and finds the slices gone on its next pass;
  agent-too    mig-1: the agent is killed first and restarted after the reboot (as a real reboot would).
The emulated kubelet and pods are not rebooted: the running pods keep running without their devices.
Checked: the Bound claims become Failed with a message; the Created claims get their slices made again and
their pods run; new pods asking for the failed pods' space run on the node (its capacity is back); and the two
global checks once every pod is deleted (no pod gated without a reason; no slice without a live claim).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from _common import Detail, Figures, Found, Report, mode_of, run_scenario, wait_for
from _migslicer import COMMON_NOTES, FreezeWhenCreated, MigRig, open_mig_rig

from gpuops_sim.harness import until

NAME = "migslicer_node_reboot"
NOTES = {
    "bound_claims_failed": "claims that were Bound (their pod had the device) and became Failed",
    "reboot_to_bound_failed_max_s": "reboot -> every Bound claim of the node Failed (worst round)",
    "reboot_to_created_remade_max_s": "reboot -> every Created claim's slice made again (worst round)",
    "placing_claims_replanned": "claims of the pods being placed that were deleted and planned again",
    "device_uuids_reused": "re-made slices with the same MIG UUID as before the reboot (the fake's UUIDs are a "
                           "function of GPU, GI id and CI id; real MIG UUIDs are new for every slice)",
    "reboot_to_new_pods_running_max_s": "reboot -> pods asking for the failed pods' space Running",
    "pods_never_ran": "pods that ended without running (e.g. refused by the kubelet's Allocate)",
    "gated_without_reason_before_cleanup": "pods gated with no MigSlices=False reason once the rounds are over, "
                                           "checked before the pods are deleted (must be 0)",
    "pods_stuck_ungated_unscheduled": "MIG pods ungated (pinned) that never ran before being deleted at the end",
    "reboot_to_placing_running_max_s": "reboot -> the pods being placed Running (-1: some never did)",
}

RUNNING = [["3g.20gb"], ["2g.10gb", "1g.5gb"]]
PLACING = [["1g.10gb"], ["1g.5gb"]]


async def one_round(mr: MigRig, node: str, kind: str, problems: list[str], wait: float) -> dict[str, Any]:
    info: dict[str, Any] = {"node": node, "kind": kind}
    gate = mr.gate(node)
    runners = [f"{node}-run{i}" for i in range(len(RUNNING))]
    for name, shape in zip(runners, RUNNING, strict=True):
        await mr.create_pod(mr.pod_body(name, shape, node=node))
    await mr.wait_running(runners, 40)
    run_uids = {r.uid for x in runners if (r := mr.track.pod(x)) is not None}
    bound = [c for c in mr.track.claims.values() if c.pod_uid in run_uids]
    await wait_for(f"{node}: running pods' claims Bound", lambda: all(c.phase == "Bound" for c in bound), 20)

    placing = [f"{node}-place{i}" for i in range(len(PLACING))]
    hook = FreezeWhenCreated(mr.track, gate, sum(len(s) for s in PLACING))
    uids = hook.uids
    mr.track.hooks.append(hook)
    try:
        for name, shape in zip(placing, PLACING, strict=True):
            await mr.create_pod(mr.pod_body(name, shape, node=node))
            r = mr.track.pod(name)
            assert r is not None
            uids.add(r.uid)
        await wait_for(f"{node}: the placing pods' claims Created", lambda: hook.frozen_at is not None, 30)
    finally:
        mr.track.hooks.remove(hook)
    created = [c for c in mr.track.claims.values() if c.pod_uid in uids]
    info["placing_claims_at_reboot"] = sorted(
        c.phase + ("+advertised" if (c.last.get("status") or {}).get("advertised") else "") for c in created)
    info["slices_at_reboot"] = len(gate.instances())
    old_devices = {c.uid: c.device for c in created}
    if kind == "agent-too":
        mr.agents[node].kill()
    gate.reboot()
    gate.release()
    rebooted = time.monotonic()
    if kind == "agent-too":
        info["agent_start_s"] = await mr.start_agent(node)

    def lost() -> bool:
        """Each running pod lost its slices: a claim of it Failed, and every other one Failed too or was Released
        (the allocator evicts the pod at its first Failed claim, and may release the rest before the agent
        reports them)."""
        by_pod: dict[str, list[Any]] = {}
        for c in bound:
            by_pod.setdefault(c.pod_uid, []).append(c)
        return all(any(c.reached("Failed") is not None for c in claims)
                   and all(c.reached("Failed") is not None or c.phase == "Released" or c.gone_at is not None
                           for c in claims) for claims in by_pod.values())

    t_failed = await wait_for(f"{node}: the Bound claims Failed", lost, 30)
    info["reboot_to_bound_failed_s"] = round(t_failed - rebooted, 3)
    info["failed_messages"] = sorted({str((c.last.get("status") or {}).get("message") or "") for c in bound
                                      if c.phase == "Failed"})
    if not all(info["failed_messages"]):
        problems.append(f"{node}: a Failed claim carries no message")

    async def remade() -> bool:
        slices = {(s.gpu_uuid, s.start): s for s in await mr.driver(node)}
        return all(c.live and (c.gpu, c.start) in slices and slices[(c.gpu, c.start)].complete for c in created)

    try:
        await until(f"{node}: the Created claims' slices made again", remade, 30)
        info["reboot_to_created_remade_s"] = round(time.monotonic() - rebooted, 3)
    except TimeoutError as e:
        problems.append(f"{node}: {e}: " + "; ".join(mr.describe(x) for x in placing))
        info["reboot_to_created_remade_s"] = None
    info["placing_claims_replanned"] = sum(1 for c in created if c.gone_at is not None)
    try:
        await mr.wait_running(placing, wait)
        info["reboot_to_placing_running_s"] = round(
            max((r.running_at or 0.0) for x in placing if (r := mr.track.pod(x)) is not None) - rebooted, 3)
    except TimeoutError as e:
        problems.append(f"{node}: pods being placed at the reboot: {e}")
        info["reboot_to_placing_running_s"] = None
    info["device_uuids_reused"] = sum(1 for c in created if c.device and c.device == old_devices.get(c.uid))
    # the failed pods' space: the same shapes again, pinned to the node
    again = [f"{node}-again{i}" for i in range(len(RUNNING))]
    for name, shape in zip(again, RUNNING, strict=True):
        await mr.create_pod(mr.pod_body(name, shape, node=node))
    try:
        ran = await mr.wait_running(again, wait)
        info["reboot_to_new_pods_running_s"] = round(time.monotonic() - rebooted, 3)
    except TimeoutError as e:
        problems.append(f"{node}: new pods for the failed pods' space: {e}")
        ran = {x: 0.0 for x in again if (r := mr.track.pod(x)) is not None and r.running_at is not None}
        info["reboot_to_new_pods_running_s"] = None
    info["new_pods_ran"] = len(ran)
    info["never_ran"] = len(mr.never_ran([*placing, *again]))  # described by final_checks
    return info


async def scenario(quick: bool) -> Found:
    problems: list[str] = []
    t0 = time.monotonic()
    async with open_mig_rig(NAME, grace=3.0, heartbeat=2.0) as mr:
        wait = 8.0 if quick else 20.0  # a healthy round runs its pods within ~2 s
        rounds = [await one_round(mr, "mig-0", "live-agent", problems, wait),
                  await one_round(mr, "mig-1", "agent-too", problems, wait)]
        if not quick:  # the same on a third node, the agent alive, after the two others settled (or not)
            rounds.append(await one_round(mr, "mig-2", "live-agent", problems, wait))
        # before the clean-up: pods left gated must say why (the end state below has no pods at all)
        gated_live, _ = await mr.check_gated(5 if quick else 10)
        problems += [f"gated without a reason before the clean-up: {g}" for g in gated_live]
        for p in mr.live_pods():
            await mr.delete_pod(p["metadata"]["name"])
        common = await mr.final_checks(problems)
        figures: dict[str, Any] = {
            "reboots": len(rounds),
            "bound_claims_failed": sum(1 for c in mr.track.claims.values()
                                       if c.reached("Bound") is not None and c.phase == "Failed"),
            "reboot_to_bound_failed_max_s": max(r["reboot_to_bound_failed_s"] for r in rounds),
            "reboot_to_created_remade_max_s": max(r["reboot_to_created_remade_s"] or -1 for r in rounds),
            "reboot_to_placing_running_max_s": max(r["reboot_to_placing_running_s"] or -1 for r in rounds),
            "reboot_to_new_pods_running_max_s": max(r["reboot_to_new_pods_running_s"] or -1 for r in rounds),
            "pods_stuck_ungated_unscheduled": sum(1 for p in mr.track.pods.values() if p.profiles
                                                  and p.ungated_at is not None and p.running_at is None),
            "placing_claims_replanned": sum(r["placing_claims_replanned"] for r in rounds),
            "device_uuids_reused": sum(r["device_uuids_reused"] for r in rounds),
            "pods_never_ran": sum(r["never_ran"] for r in rounds),
            "gated_without_reason_before_cleanup": len(gated_live),
            **common,
            "run_seconds": round(time.monotonic() - t0, 1),
        }
        return mr.verdict(figures, problems, rounds=rounds)


def report(figures: Figures, detail: Detail, args: argparse.Namespace) -> Report:
    rows = "\n".join(
        f"| {r['node']} | {r['kind']} | {r['slices_at_reboot']} | {r['placing_claims_at_reboot']} | "
        f"{r['reboot_to_bound_failed_s']} | {r['reboot_to_created_remade_s']} | {r['reboot_to_placing_running_s']} | "
        f"{r['new_pods_ran']}/{len(RUNNING)} | {r['reboot_to_new_pods_running_s']} |" for r in detail["rounds"])
    messages = sorted({m for r in detail["rounds"] for m in r["failed_messages"]})
    injected = (f"{len(detail['rounds'])} GPU reboots (slices gone) with Bound and Created claims; one with "
                "the agent killed and restarted")
    checked = ("Bound -> Failed with message, Created re-made, placing pods and new pods run, no gated pod "
               "without reason, no leaked slice")
    key = (f"{figures['bound_claims_failed']} Bound->Failed, re-made <= "
           f"{figures['reboot_to_created_remade_max_s']} s, new pods <= "
           f"{figures['reboot_to_new_pods_running_max_s']} s, {figures['leaked_slices_at_end']} leaked")
    md = f"""# MIG slicer: node reboot (emulated GPUs lose their slices) ({mode_of(args)} run)

Per round, on one node: 2 running pods ({', '.join('+'.join(s) for s in RUNNING)}; claims Bound) and 2 pods
being placed ({', '.join('+'.join(s) for s in PLACING)}; driver frozen when their claims are all Created), then
the driver state deleted. mig-1's agent is killed before and restarted after. Then the failed pods' shapes
again on the node. Failed claim messages: {'; '.join(repr(m) for m in messages)}.

| node | kind | slices at reboot | placing claims at reboot | reboot -> Bound Failed (s) | \
reboot -> Created re-made (s) | reboot -> placing Running (s) | new pods ran | reboot -> new pods Running (s) |
|---|---|---|---|---|---|---|---|---|
{rows}"""
    return Report(md, COMMON_NOTES | NOTES, listed=True, injected=injected, checked=checked, key=key)


if __name__ == "__main__":
    run_scenario(NAME, __doc__, lambda args: scenario(args.quick), report)
