"""Bad objects across all four controllers: the seeded all-controllers scenario run clean, then again with
poison objects mixed in; the healthy objects end exactly as in the clean run, and every poison object is either
refused at admission (the message names the field) or admitted and visibly failing.

Rig and workload: chaos/_allcontrollers.py (one emulated cluster, one `gpuops run` with budget, autoprovision,
spotpool and migslicer; budgets AlertOnly x 2, Pause, Evict; powered-off machines with a GPUNodeGroup each; a
SpotPool with reclaims; MIG nodes played by the in-process agent farm), the same script in both runs. No API or
cloud fault is injected: the poison objects are the only difference. The two runs go side by side (two emulated
clusters, two operators): the compared state does not depend on timing.

Poison, created at t0 of the poison run (`POISON`):
  refused   objects a careless user writes that admission must stop: a GPUNodeGroup boot timeout of 3.6e12 s
            (it overflowed a timestamp and stopped every group's planning), a label key "bad key!" in a
            SpotPool template (every node patch got 422), a tencent pool without a region, credentials in a
            webhook URL, a malformed budget selector and quota, a MIG claim past the GPU's end, a node name
            that is no DNS name, minimum > maximum. Each must be refused with 422 and a message naming the field.
  admitted  objects admission cannot judge (their trouble is in other objects or outside the cluster), each with
            something that makes its controller act on it:
            - a GPUNodeGroup claiming the machine of an existing group (`gpu-0`): the older group keeps it;
            - GPUNodeGroups whose power webhook's Secret is missing, or whose host does not resolve, each with a
              pending pod only that group could serve (so the planner powers it on, every pass);
            - SpotPools whose credentials Secret is missing, or whose endpoint does not resolve (minimum 1);
            - a GPUNodeGroup and a SpotPool naming a Secret outside the operator's namespace (kube-system): the
              rig installs no admission policy, so the operator itself must refuse to read it;
            - MIG pods asking for a profile no GPU has, and for more slices than any node holds;
            - an Evict budget over quota whose only pod a PodDisruptionBudget protects (every eviction 429).
            Each must end with a condition that says so (Ready=False, or Degraded/WebhookFailing=True; for MIG
            pods gpuops.io/MigSlices=False) with a reason, and at least one Event about it.

Compared (chaos/apiserver_all.py's canonical form, poison objects left out): every budget's usage, action and
conditions and Events; every group's state, power-ons and Events; the pool's sizes, instances and Events; every
MIG pod's phase and claims; every pod's end. Also checked in both runs: convergence, nothing doubled, budget
status == truth (chaos/apiserver_all.py); and in the poison run the operator's reconcile errors and reconciles
are reported, and its log is searched for a traceback (none may appear: a poison object must not make a
reconcile raise).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _allcontrollers import BASE, AllRig, Plan, Step, build_script, drive, open_all_rig, plan_of
from _common import Detail, Figures, Found, Report, metric_sum, mode_of, run_scenario
from apiserver_all import accuracy, canonical, compare_runs, doubling, run_figures, wait_converged

from gpuops.controllers.migslicer.api import GATE, OUR_PREFIX
from gpuops_sim.apiserver.errors import StatusError
from gpuops_sim.budget_workload import budget, pod
from gpuops_sim.cluster.access import EVENTS
from gpuops_sim.harness import until

NAME = "bad_objects"
NOTES = {
    "canonical_differences": "fields of the healthy objects' final state that differ between the runs (must be 0)",
    "poisoned_poison_refused": "poison objects admission refused (of poison_refusable: all must be)",
    "poisoned_poison_visibly_failing": "admitted poison with a failing condition and an Event (of _admitted_judged)",
    "poisoned_operator_reconcile_errors": "controller_runtime_reconcile_errors_total at the end (reported)",
    "poisoned_operator_log_tracebacks": "tracebacks in the operator's log (must be 0)",
}

POISON_NS = "poison"
POISON_LABEL = "gpuops.io/poison"
FAILING = {("Ready", "False"), ("Degraded", "True"), ("WebhookFailing", "True"), ("DeletionBlocked", "True"),
           ("gpuops.io/MigSlices", "False")}
"""Conditions that say an object is failing: one of these, with a reason, is what "visibly failing" means."""


@dataclass(frozen=True)
class Poison:
    what: str
    body: dict[str, Any]
    refused_field: str = ""
    """For objects admission must refuse: the field its message must name (empty: it must be admitted)."""

    @property
    def key(self) -> str:
        meta = self.body["metadata"]
        return f"{self.body['kind']}/{meta.get('namespace', '')}/{meta['name']}".replace("//", "/")


# ---------------------------------------------------------------------------------------------- the poison


def _group(name: str, node: str, url: str, **extra: Any) -> dict[str, Any]:
    hook = {"url": url, "timeoutSeconds": 2}
    return {"apiVersion": "gpuops.io/v1alpha1", "kind": "GPUNodeGroup",
            "metadata": {"name": name, "labels": {POISON_LABEL: "true"}},
            "spec": {"nodeName": node, "gpuCount": 8, "scaleUp": {**hook, **extra.pop("up", {})},
                     "scaleDown": dict(hook), "bootTimeoutSeconds": 60, "scaleDownUnneededSeconds": 5, **extra}}


def _pool(name: str, provider: str, **spec: Any) -> dict[str, Any]:
    template = {"instanceTypes": ["gpu.small"], **spec.pop("template", {})}
    return {"apiVersion": "gpuops.io/v1alpha1", "kind": "SpotPool",
            "metadata": {"name": name, "labels": {POISON_LABEL: "true"}},
            "spec": {"provider": provider, "minimum": 1, "maximum": 2, "template": template, **spec}}


def _budget(name: str, **spec: Any) -> dict[str, Any]:
    body = budget(name, {"poison": name}, "cpu", quota="0.0001", action="Evict", delay=0)
    body["metadata"]["namespace"] = POISON_NS
    body["spec"].update(spec)
    return body


def _waiting_pod(name: str, selector: dict[str, str]) -> dict[str, Any]:
    """A GPU pod only a poison group's node could take (its nodeSelector): pending demand for that group."""
    body = pod(name, {"poison": name}, "nvidia.com/gpu", "1", 100_000)
    body["metadata"]["namespace"] = POISON_NS
    body["spec"]["nodeSelector"] = dict(selector)
    return body


def _mig_pod(name: str, resources: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": POISON_NS, "labels": {"poison": name}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "schedulingGates": [{"name": GATE}],
                     "tolerations": [{"key": "gpuops.io/mig", "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{"name": "main", "image": "cuda",
                                     "resources": {"limits": dict(resources), "requests": dict(resources)}}]}}


def _claim(name: str, start: int, size: int) -> dict[str, Any]:
    return {"apiVersion": "gpuops.io/v1alpha1", "kind": "AllocationClaim",
            "metadata": {"name": name, "namespace": POISON_NS},
            "spec": {"podName": "p", "podUID": "u-1", "nodeName": "mig-0",
                     "gpuUUID": "GPU-00000000-0000-0000-0000-000000000000", "profile": "3g.40gb",
                     "start": start, "size": size}}


def refused() -> list[Poison]:
    ok_url = "http://power.example/start"
    return [
        Poison("group boot timeout beyond any timestamp", _group("poison-boot", "poison-n1", ok_url,
               bootTimeoutSeconds=3_600_000_000_000), "bootTimeoutSeconds"),
        Poison("group node name that is no DNS name", _group("poison-nodename", "Bad_Node", ok_url), "nodeName"),
        Poison("group webhook URL with credentials", _group("poison-userinfo", "poison-n2",
               "http://user:pass@power.example/start"), "url"),
        Poison("pool template label key that is no label key", _pool("poison-labels", "sim",
               endpoint="http://spot.example/spot/v1", template={"labels": {"bad key!": "x"}}), "labels"),
        Poison("tencent pool without a region", _pool("poison-region", "tencent",
               credentialsSecretRef={"name": "s", "namespace": POISON_NS}, template={"zones": ["ap-x-1"]}),
               "region"),
        Poison("pool minimum above maximum", _pool("poison-minmax", "sim", endpoint="http://spot.example/spot/v1",
                                                   minimum=3, maximum=1), "minimum"),
        Poison("budget selector label key that is no label key",
               _budget("poison-selector", selector={"matchLabels": {"bad key!": "x"}}), "selector"),
        Poison("budget quota of zero", _budget("poison-zero", quota={"gpuHours": "0", "windowHours": 1}),
               "gpuHours"),
        Poison("budget quota that is no quantity", _budget("poison-nan", quota={"gpuHours": "lots", "windowHours": 1}),
               "gpuHours"),
        Poison("MIG claim past the GPU's end", _claim("poison-claim", 6, 4), "start"),
    ]


def admitted(r: AllRig) -> list[Poison]:
    cloud = r.cluster.cloud.url
    missing = {"name": "no-such-secret", "namespace": "gpuops-system"}  # where the operator may read Secrets
    blocked = _budget("poison-blocked")
    target = pod("poison-blocked-pod", {"poison": "poison-blocked"}, "cpu", "100m", 100_000)
    target["metadata"]["namespace"] = POISON_NS
    target["spec"]["nodeSelector"] = dict(BASE)
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": "poison-blocked", "namespace": POISON_NS},
           "spec": {"minAvailable": 1, "selector": {"matchLabels": {"poison": "poison-blocked"}}}}
    return [
        Poison("group claiming another group's machine", _group("poison-claimed", "gpu-0",
               f"{cloud}/power/v1/machines/gpu-0/start")),
        Poison("group whose webhook Secret is missing", _group(
            "poison-nosecret", "poison-m1", f"{cloud}/power/v1/machines/poison-m1/start",
            up={"secretRef": missing, "insecureAllowHTTP": True},
            template={"labels": {POISON_LABEL: "nosecret"}})),
        Poison("group whose webhook host does not resolve", _group(
            "poison-dns", "poison-m2", "http://poison-power.invalid/start",
            template={"labels": {POISON_LABEL: "dns"}})),
        Poison("group naming a Secret outside the operator's namespace", _group(
            "poison-foreign-secret", "poison-m3", f"{cloud}/power/v1/machines/poison-m3/start",
            up={"secretRef": {"name": "any", "namespace": "kube-system"}})),
        Poison("pool naming a Secret outside the operator's namespace", _pool(
            "poison-foreign-creds", "aws", endpoint=f"{cloud}/aws",
            credentialsSecretRef={"name": "any", "namespace": "kube-system"},
            template={"region": "us-east-1", "instanceTypes": ["g4dn.xlarge"]})),
        Poison("pod only the missing-Secret group could serve", _waiting_pod("poison-wants-nosecret",
                                                                              {POISON_LABEL: "nosecret"})),
        Poison("pod only the unresolvable group could serve", _waiting_pod("poison-wants-dns", {POISON_LABEL: "dns"})),
        Poison("pool whose credentials Secret is missing", _pool(
            "poison-creds", "aws", endpoint=f"{cloud}/aws", credentialsSecretRef=missing, insecureAllowHTTP=True,
            template={"region": "us-east-1", "instanceTypes": ["g4dn.xlarge"]})),
        Poison("pool whose endpoint does not resolve", _pool("poison-endpoint", "sim",
                                                             endpoint="http://poison-spot.invalid/spot/v1")),
        Poison("MIG pod asking for a profile no GPU has", _mig_pod("poison-mig-profile",
                                                                   {OUR_PREFIX + "9g.99gb": "1"})),
        Poison("MIG pod asking for more slices than a node holds", _mig_pod("poison-mig-many",
                                                                            {OUR_PREFIX + "3g.40gb": "5"})),
        Poison("PodDisruptionBudget protecting the Evict budget's pod", pdb),
        Poison("pod the Evict budget cannot evict", target),
        Poison("Evict budget whose pod cannot be evicted", blocked),
    ]


SHOWN = ("GPUNodeGroup", "SpotPool", "GPUWorkloadBudget")
"""Kinds of admitted poison judged for a failing condition and an Event (besides the MIG pods)."""


def judged(p: Poison) -> bool:
    meta = p.body["metadata"]
    return p.body["kind"] in SHOWN or meta["name"].startswith("poison-mig-") or meta["name"] == "poison-claimed"


# ---------------------------------------------------------------------------------------------- one run


@dataclass
class PoisonReport:
    refused: dict[str, str] = field(default_factory=dict)
    """Poison key -> the refusal message (or "ADMITTED" when admission let it through)."""
    admitted_errors: dict[str, str] = field(default_factory=dict)
    """Admitted poison that the API server refused after all (a broken poison body: a problem of this script)."""
    shown: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Admitted poison key -> its failing conditions and Event reasons at the end."""


async def plant(r: AllRig, report: PoisonReport) -> list[Poison]:
    access = r.cluster.access
    await access.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": POISON_NS}})
    for p in refused():
        try:
            await access.create_object(p.body)
            report.refused[p.key] = "ADMITTED"
        except StatusError as e:
            report.refused[p.key] = f"{e.code} {e.message}"
    kept = admitted(r)
    for p in kept:
        try:
            await access.create_object(p.body)
        except StatusError as e:
            report.admitted_errors[p.key] = f"{e.code} {e.message}"
    return kept


PLURALS = {"GPUNodeGroup": "gpunodegroups", "SpotPool": "spotpools", "GPUWorkloadBudget": "gpuworkloadbudgets",
           "Pod": "pods", "PodDisruptionBudget": "poddisruptionbudgets"}


def _object(r: AllRig, p: Poison) -> dict[str, Any] | None:
    meta = p.body["metadata"]
    gr = (str(p.body["apiVersion"]).rpartition("/")[0], PLURALS[p.body["kind"]])
    return r.cluster.access.get(gr, meta.get("namespace", ""), meta["name"])


def failing_conditions(obj: dict[str, Any]) -> list[str]:
    return sorted(f"{c.get('type')}={c.get('status')} ({c.get('reason')})"
                  for c in (obj.get("status") or {}).get("conditions") or ()
                  if (c.get("type"), c.get("status")) in FAILING and c.get("reason"))


def event_reasons_of(r: AllRig, p: Poison) -> list[str]:
    meta = p.body["metadata"]
    return sorted({str(e.get("reason")) for e in r.cluster.access.iter(EVENTS)
                   if (e.get("involvedObject") or {}).get("kind") == p.body["kind"]
                   and (e.get("involvedObject") or {}).get("name") == meta["name"]})


def visible(r: AllRig, poison: list[Poison]) -> dict[str, dict[str, Any]]:
    out = {}
    for p in poison:
        if not judged(p):
            continue
        obj = _object(r, p) or {}
        out[p.key] = {"what": p.what, "failing_conditions": failing_conditions(obj),
                      "event_reasons": event_reasons_of(r, p),
                      "conditions": [f"{c.get('type')}={c.get('status')} ({c.get('reason')}): {c.get('message')}"
                                     for c in (obj.get("status") or {}).get("conditions") or ()]}
    return out


def all_visible(shown: dict[str, dict[str, Any]]) -> bool:
    return all(v["failing_conditions"] and v["event_reasons"] for v in shown.values())


async def one_run(plan: Plan, script: list[Step], seed: int, *, poisoned: bool, workdir: Path) -> dict[str, Any]:
    """The scenario once (clean or with the poison planted at t0): figures, problems, the canonical final state."""
    async with open_all_rig(plan, seed, workdir) as r:
        r.ignored = lambda obj: POISON_LABEL in (obj["metadata"].get("labels") or {}) or \
            obj["metadata"].get("namespace") == POISON_NS
        report = PoisonReport()
        poison = await plant(r, report) if poisoned else []
        t0 = time.time()
        await drive(r, script, t0)
        within = max(1.0, t0 + plan.length - time.time()) + plan.converge_within
        done, _, last_blockers = await wait_converged(r, within)
        problems = [] if done is not None else ["no convergence: " + "; ".join(last_blockers)]
        if poisoned:
            with contextlib.suppress(TimeoutError):  # reported below, object by object
                await until("every admitted poison object visibly failing",
                            lambda: _async(all_visible(visible(r, poison))), 30, every=0.5)
            report.shown = visible(r, poison)
            problems += poison_problems(report)
        text, _, _ = await r.rig.scrape()
        d_figures, d_problems = doubling(r)
        a_figures, a_problems = accuracy(r)
        tracebacks = r.rig.log_path.read_text(errors="replace").count("Traceback (most recent call last)")
        if tracebacks:
            problems.append(f"{tracebacks} traceback(s) in the operator's log")
        figures: dict[str, float | int] = {
            "converged_at_offset_s": round(done - t0, 3) if done else -1,
            **d_figures, **a_figures,
            "operator_reconcile_errors": int(metric_sum(text, "controller_runtime_reconcile_errors_total")),
            "operator_reconciles": int(metric_sum(text, "controller_runtime_reconcile_total")),
            "operator_log_tracebacks": tracebacks,
        }
        if poisoned:
            figures.update({
                "poison_refused": sum(1 for v in report.refused.values() if v != "ADMITTED"),
                "poison_refusable": len(report.refused),
                "poison_admitted_judged": len(report.shown),
                "poison_visibly_failing": sum(1 for v in report.shown.values()
                                              if v["failing_conditions"] and v["event_reasons"]),
            })
        return {"figures": figures, "problems": problems + d_problems + a_problems, "canonical": canonical(r),
                "poison": report}


async def _async(value: bool) -> bool:
    return value


def poison_problems(report: PoisonReport) -> list[str]:
    fields = {p.key: p.refused_field for p in refused()}
    out = [f"admitted although it must be refused: {k}" for k, v in report.refused.items() if v == "ADMITTED"]
    out += [f"refused without naming {fields[k]!r}: {k}: {v}" for k, v in report.refused.items()
            if v != "ADMITTED" and (not v.startswith("422") or fields[k] not in v)]
    out += [f"poison body refused (a bug of this scenario): {k}: {v}" for k, v in report.admitted_errors.items()]
    out += [f"not visibly failing: {k} ({v['what']}): conditions {v['failing_conditions'] or 'none'}, Events "
            f"{v['event_reasons'] or 'none'}" for k, v in report.shown.items()
            if not (v["failing_conditions"] and v["event_reasons"])]
    return out


# ---------------------------------------------------------------------------------------------- main


def report(figures: Figures, detail: Detail, args: argparse.Namespace) -> Report:
    plan = plan_of(args)
    refused_rows = "\n".join(f"| `{k}` | {v.replace('|', '/')} |" for k, v in detail["refused"].items())
    shown_rows = "\n".join(f"| `{k}` | {v['what']} | {', '.join(v['failing_conditions']) or 'NONE'} | "
                           f"{', '.join(v['event_reasons']) or 'NONE'} |" for k, v in detail["shown"].items())
    diff_list = "\n".join(f"- `{d}`" for d in detail["diffs"]) or "none: the healthy objects end as in the clean run."
    injected = (f"all controllers, {plan.length:g} s: {len(detail['refused'])} objects admission must refuse, "
                f"{len(detail['shown'])} admitted poison objects (claimed machine, missing or foreign Secret, "
                "unresolvable host, impossible MIG asks, an eviction a PDB blocks)")
    checked = ("healthy final state == clean run's; each refused with the field named; each admitted one "
               "failing visibly (condition + Event); no traceback")
    key = (f"{figures['canonical_differences']} differences; {figures.get('poisoned_poison_refused', 0)}/"
           f"{figures.get('poisoned_poison_refusable', 0)} refused; "
           f"{figures.get('poisoned_poison_visibly_failing', 0)}/"
           f"{figures.get('poisoned_poison_admitted_judged', 0)} visibly failing")
    md = f"""# Bad objects across all controllers ({mode_of(args)} run)

The all-controllers scenario ({plan.length:g} s: budgets alert, ap, pause and evict; {plan.machines} powered-off
machines with a GPUNodeGroup each; a SpotPool with {len(plan.reclaims)} reclaim(s); MIG pods on 2 MIG nodes) run
clean and then with poison objects planted at t0. No fault is injected: the poison is the only difference.

## Refused at admission (each must be a 422 naming the field)

| object | answer |
|---|---|
{refused_rows}

## Admitted, and visibly failing at the end

| object | what | failing conditions | Event reasons |
|---|---|---|---|
{shown_rows}

## The healthy objects

Differences between the clean and the poisoned final state: {diff_list}"""
    return Report(md, NOTES, listed=True, injected=injected, checked=checked, key=key)


async def scenario(args: argparse.Namespace) -> Found:
    plan = plan_of(args)
    script = build_script(plan, args.seed)

    async def one(name: str) -> dict[str, Any]:
        res = await one_run(plan, script, args.seed, poisoned=name == "poisoned",
                            workdir=Path(tempfile.gettempdir()) / f"{NAME}-{name}-seed{args.seed}")
        print(f"{name} run done: {res['figures']}", flush=True)
        return res

    # side by side (two clusters, two operators): the compared final state does not depend on timing
    # (chaos/_allcontrollers.py), and no fault makes either run wait out a backoff
    order = ("clean", "poisoned")
    runs = dict(zip(order, await asyncio.gather(*(one(n) for n in order)), strict=True))
    diffs, problems = compare_runs(runs, "poisoned", "healthy final state differs")
    poison: PoisonReport = runs["poisoned"]["poison"]
    return {"canonical_differences": len(diffs), **run_figures(runs)}, {
        "diffs": diffs, "problems": problems, "refused": poison.refused, "shown": poison.shown,
        "canonical": {n: res["canonical"] for n, res in runs.items()}}, not problems


if __name__ == "__main__":
    run_scenario(NAME, __doc__, scenario, report, quick="CI-sized run (14 s scenario instead of 600 s)",
                 seed="seed of the workload script")
