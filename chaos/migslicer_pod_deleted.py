"""Pods deleted while their claims are Pending or Created (before the ungate), then the space used again.

Rig (chaos/_migslicer.py): 3 MIG nodes x 2 A100-40GB, orphan grace 3 s. Each node fills up with two pods pinned
to it, one 7g.40gb (a whole GPU) each, and the pods are deleted at a chosen point:
  pending   mig-0: its driver frozen before the pods exist, so the claims stay Pending; pods deleted, then
            the driver released;
  created   mig-1: the driver frozen (by a store listener) the moment the second claim turns Created, before
            the agent advertises anything; pods deleted, then the driver released: the slices are orphans;
  racing    mig-2 (full run only): waves of pods each deleted a random 0-0.4 s after its creation, wherever
            its claims happen to be.
Then two new 7g.40gb pods pinned to each node must run (they fit only where the deleted pods' slices were).
Checked: every claim of a deleted pod is garbage-collected, slices made for deleted pods are destroyed (about
the agent's grace after the release), the later pods run on every node, and the two global checks.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Any

from _common import Detail, Figures, Found, Report, mode_of, run_scenario, wait_for
from _migslicer import COMMON_NOTES, FreezeWhenCreated, MigRig, is_gated, open_mig_rig

from gpuops_sim.harness import until

NAME = "migslicer_pod_deleted"
NOTES = {
    "claims_of_deleted_pods_left": "claims whose pod was deleted and that still exist at the end (must be 0)",
    "delete_to_claims_gone_max_s": "pod deletion -> its claims garbage-collected (worst frozen round)",
    "release_to_slices_gone_pending_s": "driver released -> node empty, claims were Pending (nothing to destroy "
                                        "unless the agent made slices for claims already gone)",
    "release_to_slices_gone_created_s": "driver released -> orphaned slices destroyed (about the 3 s grace)",
    "slices_made_for_deleted_pending_claims": "slices the agent made for claims already deleted (mig-0 round)",
    "reuse_all_running_s": "new whole-GPU pods on every node -> all Running (the space of the deleted ones)",
}

WHOLE = ["7g.40gb"]


async def fill_and_delete(mr: MigRig, node: str, kind: str) -> dict[str, Any]:
    info: dict[str, Any] = {"node": node, "kind": kind}
    gate = mr.gate(node)
    names = [f"{kind}-{i}" for i in range(2)]
    hook = FreezeWhenCreated(mr.track, gate, len(names))  # whole-GPU pods: one claim each
    uids = hook.uids
    if kind == "pending":
        await gate.hold()
    else:
        mr.track.hooks.append(hook)
    try:
        for name in names:
            await mr.create_pod(mr.pod_body(name, WHOLE, node=node))
            r = mr.track.pod(name)
            assert r is not None
            uids.add(r.uid)

        def ready() -> bool:
            mine = [c for c in mr.track.claims.values() if c.pod_uid in uids]
            return len(mine) == len(names) and (kind == "pending" or hook.frozen_at is not None)

        await wait_for(f"{node}: claims {kind}", ready, 30)
    finally:
        if hook in mr.track.hooks:
            mr.track.hooks.remove(hook)
    claims = [c for c in mr.track.claims.values() if c.pod_uid in uids]
    info["claims_at_delete"] = sorted(c.phase + ("+advertised" if (c.last.get("status") or {}).get("advertised")
                                                 else "") for c in claims)
    info["pods_gated_at_delete"] = sum(1 for u in uids if is_gated(mr.track.pods[u].last))
    info["instances_at_delete"] = len(gate.instances())
    deleted = time.monotonic()
    for name in names:
        await mr.delete_pod(name)
    t_gc = await wait_for(f"{node}: claims garbage-collected", lambda: all(c.gone_at is not None for c in claims), 30)
    info["delete_to_claims_gone_s"] = round(t_gc - deleted, 3)
    gate.release()
    released = time.monotonic()
    info["release_at_s"] = round(released - deleted, 3)

    async def empty() -> bool:
        return not await mr.driver(node)

    await until(f"{node}: the deleted pods' slices destroyed", empty, mr.grace + 20, every=0.1)
    info["release_to_slices_gone_s"] = round(time.monotonic() - released, 3)
    made = [e for e in mr.agents[node].log("slice created") if any(c.name in str(e.get("claim")) for c in claims)]
    info["slices_made_for_deleted_claims"] = len(made)
    return info


async def racing(mr: MigRig, node: str, waves: int, rng: random.Random) -> dict[str, Any]:
    """Waves of two whole-GPU pods pinned to `node`, each deleted at a random instant after its creation."""
    deleted = 0
    for w in range(waves):
        names = [f"race{w}-{i}" for i in range(2)]
        for name in names:
            await mr.create_pod(mr.pod_body(name, WHOLE, node=node))
        for name in rng.sample(names, len(names)):
            await asyncio.sleep(rng.uniform(0.0, 0.4))  # a random instant of its life, not a wait for state
            await mr.delete_pod(name)
            deleted += 1
    states = [p for c in mr.track.claims.values() if c.node == node and c.name.startswith("race")
              for p, _ in c.phases[-1:]]
    return {"node": node, "kind": "racing", "pods_deleted": deleted, "last_phase_of_claims": sorted(states)}


async def scenario(quick: bool, seed: int) -> Found:
    problems: list[str] = []
    t0 = time.monotonic()
    async with open_mig_rig(NAME, grace=3.0) as mr:
        rounds = [await fill_and_delete(mr, "mig-0", "pending"), await fill_and_delete(mr, "mig-1", "created")]
        if not quick:
            rounds.append(await racing(mr, "mig-2", 6, random.Random(seed)))
        for r in rounds[:2]:
            want = "Pending" if r["kind"] == "pending" else "Created"
            if any(not s.startswith(want) or "advertised" in s for s in r["claims_at_delete"]):
                problems.append(f"{r['node']}: claims at deletion were {r['claims_at_delete']}, not all {want} "
                                "and unadvertised (the round did not test what it says)")
        reuse_start = time.monotonic()
        later = [f"later-{n}-{i}" for n in mr.nodes for i in range(2)]
        for name in later:
            await mr.create_pod(mr.pod_body(name, WHOLE, node=name.split("-", 1)[1].rsplit("-", 1)[0]))
        ran = await mr.wait_running(later, 60)
        reuse_s = round(max(mr.ran_at(x) for x in later) - reuse_start, 3)  # never ran: final_checks says
        for name in later:
            await mr.delete_pod(name)
        common = await mr.final_checks(problems)
        gone = [c for c in mr.track.claims.values() if (p := mr.track.pods.get(c.pod_uid)) is not None
                and p.gone_at is not None]
        figures: dict[str, Any] = {
            "pods_deleted": sum(1 for p in mr.track.pods.values() if p.gone_at is not None),
            "claims_of_deleted_pods": len(gone),
            "claims_of_deleted_pods_left": sum(1 for c in gone if c.gone_at is None),
            "delete_to_claims_gone_max_s": max(r.get("delete_to_claims_gone_s", 0) for r in rounds),
            "release_to_slices_gone_pending_s": rounds[0]["release_to_slices_gone_s"],
            "release_to_slices_gone_created_s": rounds[1]["release_to_slices_gone_s"],
            "slices_made_for_deleted_pending_claims": rounds[0]["slices_made_for_deleted_claims"],
            "later_pods_ran": len(ran),
            "later_pods": len(later),
            "reuse_all_running_s": reuse_s,
            **common,
            "run_seconds": round(time.monotonic() - t0, 1),
        }
        if figures["claims_of_deleted_pods_left"]:
            problems.append(f"{figures['claims_of_deleted_pods_left']} claims of deleted pods still exist")
        return mr.verdict(figures, problems, rounds=rounds)


def report(figures: Figures, detail: Detail, args: argparse.Namespace) -> Report:
    rows = "\n".join(f"| {r['node']} | {r['kind']} | {r.get('claims_at_delete', r.get('last_phase_of_claims'))} | "
                     f"{r.get('delete_to_claims_gone_s', '-')} | {r.get('release_to_slices_gone_s', '-')} | "
                     f"{r.get('slices_made_for_deleted_claims', '-')} |" for r in detail["rounds"])
    injected = "pods deleted with claims Pending / Created-unadvertised" + ("" if args.quick else " / random")
    checked = ("claims GC'd, orphan slices destroyed after grace, capacity reused, no gated pod without "
               "reason, no leaked slice")
    key = (f"{figures['claims_of_deleted_pods_left']} claims left, orphans gone "
           f"{figures['release_to_slices_gone_created_s']} s after release, reuse {figures['reuse_all_running_s']} "
           f"s, {figures['leaked_slices_at_end']} leaked")
    md = f"""# MIG slicer: pods deleted before their slices are handed over ({mode_of(args)} run)

Two whole-GPU (7g.40gb) pods pinned to a node, deleted while their claims are Pending (driver frozen from the
start) or Created and not yet advertised (driver frozen the moment the second claim is Created); the full
run adds waves of pods deleted at random instants on mig-2. Then two whole-GPU pods per node must run.

| node | kind | claims at deletion (or last phase seen) | delete -> claims gone (s) | \
release -> node empty (s) | slices the agent made for these claims |
|---|---|---|---|---|---|
{rows}"""
    return Report(md, COMMON_NOTES | NOTES, listed=True, injected=injected, checked=checked, key=key)


if __name__ == "__main__":
    run_scenario(NAME, __doc__, lambda args: scenario(args.quick, args.seed), report)
