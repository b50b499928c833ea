"""API-server chaos across all four controllers: the same seeded scenario run clean, then under faults;
every object converges and the faulted run's final state equals the clean run's.

Rig and workload: chaos/_allcontrollers.py (one emulated cluster, one `gpuops run` with budget, autoprovision,
spotpool and migslicer; budgets AlertOnly x 2, Pause, Evict; powered-off machines with a GPUNodeGroup each; a
SpotPool with reclaims; MIG nodes played by the in-process agent farm). The script is seeded (`--seed`) and
identical for both runs.

Injected in the faulted run only, inside [faults_from, faults_until] of the timeline (they stop before the end):
5 % HTTP 500 on every request; 429 storms (a share of every request answered 429 with Retry-After, for some
seconds); every open watch closed every 5 s; two forced compactions, each followed by a drop (re-watches meet
410 Gone and relist); one full API outage (the port closed: connections refused). Full: a 600 s scenario with
faults from t = 5 to 595 s, a 20 s outage, three 8 s storms (60 %, Retry-After 2 s). `--quick` (CI, both runs
< 90 s on 2 cores): a 14 s scenario with faults from t = 1 to 9 s, a 2 s outage, two 1 s storms (Retry-After
1 s), watches dropped every 2.5 s, every fault kind still present; the runs go side by side (two emulated
clusters, two operators), since the faulted run's tail (informers waiting out re-watch backoffs of up to
2 x 30 s, chaos/_allcontrollers.py QUICK) would not fit after a clean run.

Convergence (both runs, deadline): the operator's `workqueue_depth` 0 for every queue, every budget, group and
pool with status.observedGeneration == metadata.generation, every pod terminal (or deleted by its budget's
action), no pod gated, every group Off with its machine off, the pool at its minimum and Ready, no live
AllocationClaim and no slice left in the farm, every budget's status written after its last pod ended with
runningPods 0. Reported: seconds from the faults' end (and from t0) to convergence.

Final state (the canonical form; `canonical`) compared field by field, each difference a failure:
  budgets   action; usage of every pod not stopped by the budget, exact from the ledger (start/end x GPUs); the
            exact status.consumedGpuHours for budgets that stop nothing (alert, ap); over quota or not; the set
            of pods (Evict) or Jobs (Pause) the action hit; the pods the operator logged as evicted (an ended
            pod evicted from a stale cache shows there); conditions (type, status, reason); Event reasons.
            Not compared: the total of Pause/Evict budgets, which includes the long pods' usage up to the instant
            the action stopped them: timing (faults delay it) by nature; it is checked against the truth instead.
  groups    state, the machine's power state and power-on count, conditions, Event reasons.
  pool      desired/size/ready, instances in status, live instances, instances created, reclaims, conditions,
            Event reasons.
  MIG       per pod: phase, slices asked, claims made and their profiles; live claims and farm slices left.
  pods      every pod's end (its terminal phase, or "deleted-<phase>" for pods removed before they ended: the
            budgets' actions), Job pods named by their Job; a finished pod removed later (the pod GC once its
            machine is off, at a time that depends on the run) still counts as its phase.
Event reasons that only report a failed call (EvictionFailed, EnforcementFailed, ...) are listed apart and
not compared. The form is deterministic by design (see chaos/_allcontrollers.py: whole-second runtimes, enforced
budgets whose actions always hit exactly the long pods, one wave per machine, one replacement per reclaim);
`--verify-determinism` runs the clean scenario twice and compares those two as well.

Also checked in both runs (nothing doubled): no duplicate power transition (chaos/_autoprovision.py
`power_report`), no client token that created instances twice and instances created == minimum + reclaims, at
most one eviction per pod (the operator's "evicted pod" records), claims per MIG pod == its slices and the
MIG tracker's invariants; budget status == the truth (GPU-seconds, 1 s per pod the action stopped; above it, 1 s per
GPU of each finished pod, the precision of its recorded finishedAt).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any

from _allcontrollers import (
    BUDGETS,
    GROUPS,
    POOL,
    POOLS,
    AllRig,
    Faulter,
    Plan,
    Step,
    build_script,
    drive,
    open_all_rig,
    plan_of,
)
from _autoprovision import power_report
from _budget import NS, gpu_seconds
from _common import Detail, Figures, Found, Report, log_records, metric_sum, mode_of, run_scenario

from gpuops.accounting.reporting import counting_instant
from gpuops_sim.budget_workload import micros
from gpuops_sim.cluster.access import EVENTS, JOBS
from gpuops_sim.harness import until

NAME = "apiserver_all"
NOTES = {
    "faulted_injected_500s": "HTTP 500s the emulator answered (5 % of every request in the fault window)",
    "faulted_injected_429s": "HTTP 429s (Retry-After) answered during the storms",
    "faulted_watches_dropped": "watch connections closed (every 5 s, and after each compaction)",
    "faulted_operator_relists_expired_410": "informer relists after 410 Gone (operator's /metrics)",
    "faulted_outage_seconds": "the API server's port closed (connections refused)",
    "faulted_converge_after_faults_stop_s": "faults end -> every object converged (module docstring)",
    "clean_converge_after_faults_stop_s": "the same instant of the clean run's timeline -> converged (< 0: before it)",
    "faulted_converged_at_offset_s": "t0 -> converged (the scenario lasts `length` s; its last pod ends earlier)",
    "canonical_differences": "fields of the final state that differ between the clean and the faulted run (0)",
    "faulted_power_duplicate_transitions": "new key for a power transition already under way (0)",
    "faulted_pods_evicted_twice": "pods the operator evicted more than once (0)",
    "faulted_mig_pods_claims_not_slices": "MIG pods whose claims ever made != slices asked (0)",
}

TRANSIENT = frozenset({"EvictionBlocked", "EvictionFailed", "EnforcementFailed", "WebhookFailed", "LaunchLost",
                       "LaunchRenewed", "LaunchRejected", "CapacityError", "FailedMigAllocation"})
"""Event reasons that report one failed call (a fault's direct trace), not a state: listed, not compared.
EvictionBlocked is the budget controller's name for any 429 on an eviction (it reads every 429 as a PDB's), so
an injected 429 storm shows as one."""
ROUNDING = 0.0018
"""GPU-seconds: status.consumedGpuHours has 6 decimals (5e-7 GPU-h)."""
KINDS = {"GPUWorkloadBudget", "GPUNodeGroup", "SpotPool", "Pod", "Job"}
STOPPING = {"pause", "evict"}


# ---------------------------------------------------------------------------------------------- convergence


def _generation_current(obj: dict[str, Any]) -> bool:
    return bool((obj.get("status") or {}).get("observedGeneration") == obj["metadata"].get("generation"))


def _pods_done(r: AllRig) -> bool:
    for rec in r.log.records.values():
        if rec.gone_at is not None:
            continue
        phase = (rec.last.get("status") or {}).get("phase")
        if phase not in ("Succeeded", "Failed") or rec.last["spec"].get("schedulingGates"):
            return False
    return True


def _budgets_final(r: AllRig) -> bool:
    return not _budgets_not_final(r)


def _budgets_not_final(r: AllRig) -> list[str]:
    """Budgets whose status was not written after their last pod stopped using GPUs (ended, or went while
    running: a finished pod removed later, e.g. by the pod GC once its machine is off, changes no usage), or
    that still count pods running."""
    out = []
    for b in r.objects(BUDGETS):
        st, name = b.get("status") or {}, b["metadata"]["name"]
        ends = [rec.terminal_at or rec.gone_at or 0 for rec in r.log.select({"budget": name})]
        # computedAt is a counting instant (whole second): the status of the second the last pod ended is final
        last = counting_instant(max(ends)) if ends else 0
        if not st.get("computedAt") or st.get("runningPods") or (ends and micros(st["computedAt"]) < last):
            out.append(f"{name} (computedAt {st.get('computedAt')}, runningPods {st.get('runningPods')}, last pod "
                       f"end {max(ends, default=0) / 1e6:.3f})")
    return out


def _checks(r: AllRig) -> dict[str, bool]:
    """The state parts of the convergence predicate, by name (module docstring)."""
    return {
        "pods_terminal": _pods_done(r),
        "budget_status_final": _budgets_final(r),
        "pool_at_minimum": r.pool_converged(),
        "observed_generation": all(_generation_current(o) for gr in (BUDGETS, GROUPS, POOLS) for o in r.objects(gr)),
        "groups_off": all((g.get("status") or {}).get("state") == "Off" for g in r.objects(GROUPS))
        and all(r.cluster.fleet.machines[m].state == "off" for m in r.machine_names),
        "no_live_claims": not r.track.live_claims() and not any(n.slices for n in r.farm.nodes.values()),
    }


async def wait_converged(r: AllRig, within: float) -> tuple[float | None, dict[str, float], list[str]]:
    """Wall time convergence was first seen (None after `within`), when each check last failed, and what held
    it up last (`blockers`, sampled every 2 s: evidence for the report)."""
    last_failed: dict[str, float] = {}
    last_blockers: list[str] = []
    sampled = 0.0

    async def probe() -> bool:
        nonlocal last_blockers, sampled
        checks = _checks(r)
        text, _, _ = await r.rig.scrape()
        checks["workqueues_empty"] = metric_sum(text, "workqueue_depth") == 0
        now = time.time()
        for name, ok in checks.items():
            if not ok:
                last_failed[name] = now
        if not all(checks.values()) and now - sampled >= 2:
            last_blockers, sampled = await blockers(r), now
        return all(checks.values())

    try:
        await until("every object converged", probe, within, every=0.2)
    except TimeoutError:
        return None, last_failed, last_blockers
    return time.time(), last_failed, last_blockers


async def blockers(r: AllRig) -> list[str]:
    """What keeps convergence from holding (for the report when it times out)."""
    out = []
    text, _, _ = await r.rig.scrape()
    depth = metric_sum(text, "workqueue_depth")
    if depth:
        out.append(f"workqueue_depth {depth:g}: " + "; ".join(
            ln for ln in text.splitlines() if ln.startswith("workqueue_depth{") and not ln.endswith(" 0.0")))
    out += [f"{gr[1]}/{o['metadata']['name']} observedGeneration {(o.get('status') or {}).get('observedGeneration')}"
            f" != {o['metadata'].get('generation')}" for gr in (BUDGETS, GROUPS, POOLS) for o in r.objects(gr)
            if not _generation_current(o)]
    if not _pods_done(r):
        out.append("pods not terminal: " + ", ".join(
            f"{rec.last['metadata']['name']}={(rec.last.get('status') or {}).get('phase')}"
            for rec in r.log.records.values() if rec.gone_at is None
            and (rec.last.get("status") or {}).get("phase") not in ("Succeeded", "Failed")))
    if not _budgets_final(r):
        out.append("budget status not final: " + ", ".join(_budgets_not_final(r)))
    if not r.pool_converged():
        st = r.pool().get("status") or {}
        out.append(f"pool: live {len(r.led.live())} status desired/size/ready {st.get('desired')}/{st.get('size')}/"
                   f"{st.get('ready')} pendingLaunch {st.get('pendingLaunch')}")
    out += [f"group {g['metadata']['name']} {(g.get('status') or {}).get('state')} machine "
            f"{r.cluster.fleet.machines[g['metadata']['name']].state}" for g in r.objects(GROUPS)
            if (g.get("status") or {}).get("state") != "Off"]
    out += [f"live claim {c.name} ({c.phase})" for c in r.track.live_claims()]
    return out


# ---------------------------------------------------------------------------------------------- canonical state


def _pod_key(last: dict[str, Any]) -> str:
    """A pod's name in the canonical form: Job pods (random suffix) by their Job."""
    for ref in last["metadata"].get("ownerReferences") or ():
        if ref.get("kind") == "Job":
            return f"job/{ref['name']}"
    return str(last["metadata"]["name"])


def _conditions(obj: dict[str, Any]) -> list[list[str]]:
    return sorted([str(c.get("type")), str(c.get("status")), str(c.get("reason") or "")]
                  for c in (obj.get("status") or {}).get("conditions") or ())


def event_reasons(r: AllRig) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(compared, transient) Event reasons per object "Kind/name" (Job pods by their Job), deduplicated."""
    keys = {rec.last["metadata"]["name"]: _pod_key(rec.last) for rec in r.log.records.values()}
    kept: dict[str, set[str]] = {}
    apart: dict[str, set[str]] = {}
    for e in r.cluster.access.iter(EVENTS):
        inv = e.get("involvedObject") or {}
        if inv.get("kind") not in KINDS:
            continue
        name = keys.get(inv.get("name", ""), inv.get("name", "")) if inv.get("kind") == "Pod" else inv.get("name")
        reason = str(e.get("reason"))
        (apart if reason in TRANSIENT else kept).setdefault(f"{inv['kind']}/{name}", set()).add(reason)
    return ({k: sorted(v) for k, v in sorted(kept.items())}, {k: sorted(v) for k, v in sorted(apart.items())})


def _ledger_usage(r: AllRig, st: dict[str, Any], skip: set[str]) -> dict[str, str]:
    """GPU-seconds of each ledger entry (start/end x GPUs, exact) not among `skip`, by canonical pod name.

    An entry may end up to one second after its pod's recorded finishedAt (the record's precision: a figure
    reported while the pod's finish had not reached the operator is not taken back, within that second). Such an
    entry shows as its pod's exact usage from the container timestamps, so runs compare equal when both are
    within the rule; anything else shows as itself, with the truth beside it."""
    records = r.log.records
    by_uid = {uid: _pod_key(rec.last) for uid, rec in records.items()}
    out = {}
    for e in ((st.get("ledger") or {}).get("entries")) or ():
        key = by_uid.get(e.get("uid", ""), e.get("name", ""))
        if key in skip:
            continue
        gpus = Fraction(e.get("gpus") or "0")
        seconds = Fraction(micros(e["end"]) - micros(e["start"]), 1_000_000) * gpus
        rec = records.get(e.get("uid", ""))
        exact = gpu_seconds(rec) if rec is not None and rec.terminal_at is not None else None
        if exact is not None and exact <= seconds <= exact + gpus:
            seconds = exact
        out[key] = str(seconds) if exact is None or seconds == exact else f"{seconds} (truth {exact})"
    return dict(sorted(out.items()))


def stopped_by_budget(r: AllRig, name: str) -> list[str]:
    """Pods (Evict: removed while not finished) or Jobs (Pause: suspended with our annotation) the action hit."""
    if name == "pause":
        return sorted(f"job/{j['metadata']['name']}" for j in r.cluster.access.iter(JOBS, NS)
                      if (j["metadata"].get("annotations") or {}).get("gpuops.io/paused-by") == f"{NS}/pause"
                      and j["spec"].get("suspend"))
    return sorted(_pod_key(rec.last) for rec in r.log.select({"budget": name})
                  if rec.gone_at is not None and rec.terminal_at is None)


def evicted_by_operator(r: AllRig, name: str) -> list[str]:
    """Pods of budget `name` the operator logged as evicted (an ended pod evicted from a stale cache shows here)."""
    keys = {f"{NS}/{rec.last['metadata']['name']}": _pod_key(rec.last) for rec in r.log.select({"budget": name})}
    logged = (str(rec.get("pod")) for rec in log_records(r.rig.log_path, "evicted pod"))
    return sorted(keys[p] for p in logged if p in keys)


def budget_state(r: AllRig, b: dict[str, Any], reasons: dict[str, list[str]]) -> dict[str, Any]:
    name, st = b["metadata"]["name"], b.get("status") or {}
    stopped = stopped_by_budget(r, name)
    skip = set(stopped) | ({_pod_key(rec.last) for rec in r.log.select({"budget": name})
                            if rec.last["metadata"]["name"].startswith(f"{name}-b")} if name in STOPPING else set())
    out = {
        "action": b["spec"]["enforcement"]["action"],
        "usage_gpu_seconds": _ledger_usage(r, st, skip),
        "ledger_buckets": len(((st.get("ledger") or {}).get("buckets")) or ()),
        "over_quota": Fraction(st.get("consumedGpuHours") or "0") > Fraction(st.get("quotaGpuHours") or "0"),
        "stopped_by_action": stopped,
        "evicted_by_operator": evicted_by_operator(r, name),
        "conditions": _conditions(b),
        "event_reasons": reasons.get(f"GPUWorkloadBudget/{name}", []),
    }
    return out


def group_state(r: AllRig, g: dict[str, Any], reasons: dict[str, list[str]]) -> dict[str, Any]:
    name = g["metadata"]["name"]
    machine = r.cluster.fleet.machines[name]
    return {"state": (g.get("status") or {}).get("state"), "machine": machine.state, "power_ons": machine.power_cycles,
            "conditions": _conditions(g), "event_reasons": reasons.get(f"GPUNodeGroup/{name}", [])}


def mig_state(r: AllRig) -> dict[str, Any]:
    pods = {}
    for rec in r.track.pods.values():
        if not rec.profiles:
            continue
        claims = r.track.claims_of(rec.uid)
        pods[rec.name] = {"phase": rec.phase, "slices": rec.profiles, "claims": len(claims),
                          "claim_profiles": sorted(c.profile for c in claims)}
    return {"pods": dict(sorted(pods.items())), "live_claims": len(r.track.live_claims()),
            "farm_slices": sum(len(n.slices) for n in r.farm.nodes.values())}


def canonical(r: AllRig) -> dict[str, Any]:
    """The final state in the form compared between runs (module docstring)."""
    reasons, _ = event_reasons(r)
    pool = r.pool()
    st = pool.get("status") or {}
    pods: dict[str, str] = {}
    for rec in r.log.records.values():  # a finished pod removed later (pod GC after its machine went off): its end
        phase = str((rec.last.get("status") or {}).get("phase") or "Pending")
        stopped = rec.gone_at is not None and rec.terminal_at is None
        pods[_pod_key(rec.last)] = f"deleted-{phase}" if stopped else phase
    return {
        "budgets": {b["metadata"]["name"]: budget_state(r, b, reasons) for b in r.objects(BUDGETS)},
        "node_groups": {g["metadata"]["name"]: group_state(r, g, reasons) for g in r.objects(GROUPS)},
        "spot_pool": {"desired": st.get("desired"), "size": st.get("size"), "ready": st.get("ready"),
                      "status_instances": len(st.get("instances") or ()), "live_instances": len(r.led.live()),
                      "instances_created": r.led.created(), "reclaims": len(r.reclaimed),
                      "conditions": _conditions(pool), "event_reasons": reasons.get(f"SpotPool/{POOL}", [])},
        "mig": mig_state(r),
        "pods": dict(sorted(pods.items())),
    }


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Every leaf that differs between two canonical forms, as "path: a != b"."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{path}/{k}: {a.get(k, '<absent>')!r} != {b.get(k, '<absent>')!r}")
            else:
                out += differences(a[k], b[k], f"{path}/{k}")
        return out
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


# ---------------------------------------------------------------------------------------------- doubling checks


def doubling(r: AllRig) -> tuple[dict[str, int], list[str]]:
    """Figures and problems of the "nothing doubled" checks (module docstring)."""
    figures, _, problems = power_report(r.ap, r.machine_names)
    tokens = Counter(c.token for c in r.led.launches if c.created)
    twice = sorted(t for t, n in tokens.items() if n > 1)
    expected = r.plan.spot_minimum + len(r.reclaimed)
    if twice:
        problems.append(f"spot client tokens that created instances more than once: {twice}")
    if r.led.created() != expected:
        problems.append(f"spot instances created {r.led.created()} != minimum + reclaims = {expected}")
    evictions = Counter(str(rec.get("pod")) for rec in log_records(r.rig.log_path, "evicted pod"))
    twice_evicted = sorted(p for p, n in evictions.items() if n > 1)
    if twice_evicted:
        problems.append(f"pods evicted more than once: {twice_evicted}")
    mig_pods = [p for p in r.track.pods.values() if p.profiles]
    extra = [f"{p.name}: {len(r.track.claims_of(p.uid))} claims for {len(p.profiles)} slice(s)" for p in mig_pods
             if len(r.track.claims_of(p.uid)) != len(p.profiles)]
    problems += [f"MIG claims != slices: {x}" for x in extra] + [f"MIG invariant: {v}" for v in r.track.violations]
    return {
        "power_duplicate_transitions": figures["duplicate_transitions"],
        "power_undecided_keys": figures["undecided_keys_sent"],
        "power_on_decisions": figures["power_on_decisions"],
        "power_cycles": figures["power_cycles"],
        "spot_launch_calls": len(r.led.launches),
        "spot_tokens_created_twice": len(twice),
        "spot_instances_created": r.led.created(),
        "evictions": sum(evictions.values()),
        "pods_evicted_twice": len(twice_evicted),
        "mig_pods": len(mig_pods),
        "mig_claims": sum(len(r.track.claims_of(p.uid)) for p in mig_pods),
        "mig_pods_claims_not_slices": len(extra),
        "mig_invariant_violations": len(r.track.violations),
    }, problems


def accuracy(r: AllRig) -> tuple[dict[str, float], list[str]]:
    """Each budget's final status against the truth (GPU-seconds): to the status's rounding, plus 1 s per pod its
    action stopped (the operator may end those at its own instant, the truth at the store's); above the truth,
    also 1 s per GPU of each finished pod (the precision of its recorded finish)."""
    out, problems = {}, []
    now = int(time.time() * 1_000_000)
    for b in r.objects(BUDGETS):
        name = b["metadata"]["name"]
        truth = r.log.truth({"budget": name}, now) * 3600
        status = Fraction((b.get("status") or {}).get("consumedGpuHours") or "0") * 3600
        delta = float(status - truth)
        out[f"budget_{name}_status_minus_truth_gpu_seconds"] = round(delta, 4)
        tol = len(stopped_by_budget(r, name)) + ROUNDING
        # A finished pod may count up to one second past its recorded finishedAt (its precision), per GPU.
        entries = (((b.get("status") or {}).get("ledger") or {}).get("entries")) or ()
        over_tol = tol + float(sum(Fraction(e.get("gpus") or "0") for e in entries))
        # Pause: the Job controller deletes the paused pods. Without retainFinishedPods a budget ends a pod deleted
        # by someone else when its informer hears of it (the documented limitation; the finalizer closes it), which
        # is late while watches are down: an over-count is reported, a loss is a failure.
        over_ok = name == "pause"
        if delta < -tol or (delta > over_tol and not over_ok):
            problems.append(f"budget {name}: status {float(status):.3f} GPU-s vs truth {float(truth):.3f}")
    return out, problems


# ---------------------------------------------------------------------------------------------- one run


async def one_run(plan: Plan, script: list[Step], seed: int, *, faulted: bool, workdir: Path) -> dict[str, Any]:
    """The scenario once (faulted or clean): figures, problems, the canonical final state."""
    began = time.time()
    async with open_all_rig(plan, seed, workdir) as r:
        t0 = time.time()
        faulter = Faulter(r)
        tasks = [asyncio.create_task(drive(r, script, t0))]
        if faulted:
            tasks.append(asyncio.create_task(faulter.run(t0)))
        await asyncio.gather(*tasks)
        stop = faulter.stopped_at if faulted else t0 + plan.faults_until
        within = max(1.0, t0 + plan.length - time.time()) + plan.converge_within
        done, last_failed, last_blockers = await wait_converged(r, within)
        problems = [] if done is not None else ["no convergence: " + "; ".join(await blockers(r))]
        figures: dict[str, float | int] = {
            "converge_after_faults_stop_s": round(done - stop, 3) if done else -1,
            "converged_at_offset_s": round(done - t0, 3) if done else -1,
            "setup_s": round(t0 - began, 3),
            **{f"last_unconverged_{k}_offset_s": round(v - t0, 3) for k, v in sorted(last_failed.items())},
        }
        text, _, _ = await r.rig.scrape()
        d_figures, d_problems = doubling(r)
        a_figures, a_problems = accuracy(r)
        figures.update({**d_figures, **a_figures, **_operator_figures(text)})
        if faulted:
            figures.update(_fault_figures(r, faulter, text))
        _, transient = event_reasons(r)
        return {"figures": figures, "problems": problems + d_problems + a_problems, "canonical": canonical(r),
                "transient_event_reasons": transient, "last_blockers": last_blockers}


def _operator_figures(text: str) -> dict[str, float | int]:
    return {
        "operator_requests": int(metric_sum(text, "rest_client_requests_total")),
        "operator_500s_received": int(metric_sum(text, "rest_client_requests_total", {"code": "500"})),
        "operator_429s_received": int(metric_sum(text, "rest_client_requests_total", {"code": "429"})),
        "operator_relists_expired_410": int(metric_sum(text, "gpuops_informer_relists_total", {"reason": "expired"})),
        "operator_relists_total": int(metric_sum(text, "gpuops_informer_relists_total")),
        "operator_watch_restarts": int(metric_sum(text, "gpuops_informer_watch_restarts_total")),
        "operator_reconcile_errors": int(metric_sum(text, "controller_runtime_reconcile_errors_total")),
    }


def _fault_figures(r: AllRig, f: Faulter, text: str) -> dict[str, float | int]:
    return {
        "injected_500s": r.faults.by_code[500],
        "injected_429s": r.faults.by_code[429],
        "storms": f.storms,
        "watches_dropped": f.watch.dropped,
        "drop_rounds": f.watch.rounds,
        "compactions": f.watch.compactions,
        "outage_seconds": f.watch.outage_seconds,
    }


# ---------------------------------------------------------------------------------------------- main


def report(figures: Figures, detail: Detail, args: argparse.Namespace) -> Report:
    plan = plan_of(args)
    diff_list = "\n".join(f"- `{d}`" for d in detail["diffs"]) or "none: the final states are equal."
    transient = detail["transient_event_reasons"]
    injected = (f"all controllers, {plan.length:g} s: 5 % 500s, {len(plan.storms)} 429 storms (Retry-After), "
                f"watch drops every {plan.drop_every:g} s, {len(plan.compactions)} compactions (410), "
                f"{plan.outage_seconds:g} s outage")
    checked = "convergence; final state == clean run's; nothing doubled; budget status == truth"
    key = (f"{figures['canonical_differences']} differences; {figures.get('faulted_injected_500s', 0)} 500s, "
           f"{figures.get('faulted_injected_429s', 0)} 429s, {figures.get('faulted_watches_dropped', 0)} watches "
           f"dropped, {figures.get('faulted_operator_relists_expired_410', 0)} 410 relists; converged "
           f"{figures.get('faulted_converge_after_faults_stop_s', -1):g} s after the faults")
    md = f"""# API-server chaos across all controllers ({mode_of(args)} run)

One emulated cluster, one `gpuops run` (budget, autoprovision, spotpool, migslicer), the same seeded
{plan.length:g} s scenario run clean and then under faults: {plan.error_rate:.0%} HTTP 500 on every request,
{len(plan.storms)} 429 storms ({plan.storm_rate:.0%} of requests, Retry-After {plan.retry_after} s,
{", ".join(f"{s:g} s at t={a:g}" for a, s in plan.storms)}), every watch dropped every {plan.drop_every:g} s,
compactions + drop (410) at t = {", ".join(f"{c:g}" for c in plan.compactions)} s, a {plan.outage_seconds:g} s
outage at t = {plan.outage_at:g} s; faults from t = {plan.faults_from:g} to {plan.faults_until:g} s.
Workload: budgets alert (AlertOnly, over quota), ap (AlertOnly, under), pause (Pause), evict (Evict);
{plan.machines} powered-off machines, one pinned wave each; a SpotPool (minimum {plan.spot_minimum}) with
{len(plan.reclaims)} reclaim(s); {len(plan.mig_waves) * plan.mig_pods_per_wave} MIG pods on 2 MIG nodes.

Checked: convergence after the faults; the canonical final state (see the script's docstring) equal to the
clean run's; nothing doubled (power transitions, spot launches, evictions, MIG claims); budget status == truth.

Differences between the clean and the faulted final state:
{diff_list}

Failure-only Event reasons seen in the faulted run (not compared): {transient or "none"}

What held the faulted run's convergence up last (sampled every 2 s): {"; ".join(detail["last_blockers"]["faulted"])
                                                                      or "nothing"}"""
    return Report(md, NOTES, listed=True, injected=injected, checked=checked, key=key)


async def run_all(plan: Plan, script: list[Step], seed: int, order: list[str], *, side_by_side: bool
                  ) -> dict[str, dict[str, Any]]:
    """Every run of `order`: one after the other, or side by side (--quick: the faulted run's tail, informers
    waiting out re-watch backoffs of up to 2 x 30 s, would not fit 90 s after a clean run)."""
    async def one(name: str) -> dict[str, Any]:
        res = await one_run(plan, script, seed, faulted=name == "faulted",  # operator logs kept in /tmp
                            workdir=Path(tempfile.gettempdir()) / f"{NAME}-{name}-seed{seed}")
        print(f"{name} run done: {res['figures']}", flush=True)
        return res

    if side_by_side:
        return dict(zip(order, await asyncio.gather(*(one(n) for n in order)), strict=True))
    return {n: await one(n) for n in order}


def determinism_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verify-determinism", action="store_true",
                        help="run the clean scenario twice and compare those final states too")


def compare_runs(runs: dict[str, dict[str, Any]], other: str, differs: str) -> tuple[list[str], list[str]]:
    """The differences of run `other`'s canonical final state from the clean run's, and the problems of the
    comparison: every run's own (prefixed with its name), then each difference (`differs` says what differs)."""
    diffs = differences(runs["clean"]["canonical"], runs[other]["canonical"])
    problems = [f"{n}: {p}" for n, res in runs.items() for p in res["problems"]]
    return diffs, problems + [f"{differs}: {d}" for d in diffs]


def run_figures(runs: dict[str, dict[str, Any]]) -> dict[str, float | int]:
    """Every run's figures, each prefixed with the run's name."""
    return {f"{n}_{k}": v for n, res in runs.items() for k, v in res["figures"].items()}


async def scenario(args: argparse.Namespace) -> Found:
    plan = plan_of(args)
    script = build_script(plan, args.seed)
    order = ["clean", "clean2", "faulted"] if args.verify_determinism else ["clean", "faulted"]
    runs = await run_all(plan, script, args.seed, order, side_by_side=args.quick)
    diffs, problems = compare_runs(runs, "faulted", "final state differs")
    figures: dict[str, float | int] = {"canonical_differences": len(diffs)}
    if "clean2" in runs:
        twice = differences(runs["clean"]["canonical"], runs["clean2"]["canonical"])
        figures["clean_vs_clean_differences"] = len(twice)
        problems += [f"clean runs differ (not deterministic): {d}" for d in twice]
    figures.update(run_figures(runs))
    return figures, {"diffs": diffs, "problems": problems,
                     "canonical": {n: res["canonical"] for n, res in runs.items()},
                     "transient_event_reasons": runs["faulted"]["transient_event_reasons"],
                     "last_blockers": {n: res["last_blockers"] for n, res in runs.items()}}, not problems


if __name__ == "__main__":
    run_scenario(NAME, __doc__, scenario, report, quick="CI-sized run (22 s scenario, both runs < 90 s)",
                 seed="seed of the workload script and the fault draws", more=determinism_flag)
