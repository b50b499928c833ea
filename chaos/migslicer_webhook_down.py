"""The MIG webhook unreachable (operator down): pods as its failurePolicy says, then admitted once it is back.

Rig (chaos/_migslicer.py): 2 MIG nodes x 2 A100-40GB. A few MIG pods run first (baseline admission). Then the
operator (which serves the webhook) is killed (SIGKILL) and, for the outage, clients keep trying to create
pods every 0.5 s until they succeed, as controllers retry:
  MIG pods in `chaos`        must be refused (failurePolicy Fail): admitted unmutated, they would ask for
                             nvidia.com/mig-* and bypass the slicer;
  plain pods in `chaos`      a 1.30+ apiserver evaluates the webhook's matchConditions and admits them without a
                             call. Emulators that ignore matchConditions call the webhook for every pod and refuse
                             them too; what this emulator did is reported (either way not a failure);
  pods in `gpuops-system`    excluded by the namespaceSelector: admitted without a call (the MIG one unrenamed and
                             ungated: the manifest says to run MIG workloads elsewhere; it is deleted at once).
The operator is restarted after the outage; the new replica adds its fresh CA to the caBundle, so the first
calls after the restart may still fail (TLS) until it has. Checked: no MIG pod of `chaos` admitted during the
outage nor ever stored unrenamed; every MIG pod admitted after the restart carries the gate and our resource
names from its first stored version and runs; the plain pods run; the two global checks once pods finished.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from typing import Any

from _common import Detail, Figures, Found, Report, mode_of, run_scenario, wait_for
from _migslicer import COMMON_NOTES, NS, SYSTEM_NS, MigRig, is_gated, open_mig_rig, pace

from gpuops.controllers.migslicer.api import NVIDIA_PREFIX, OUR_PREFIX

NAME = "migslicer_webhook_down"
NOTES = {
    "mig_refusals": "MIG pod creations refused (failurePolicy Fail), retries included",
    "mig_refusals_after_restart": "of those, after the restart (the new CA not yet in the caBundle, or not serving)",
    "mig_admitted_during_outage": "MIG pods admitted while the webhook was down (must be 0)",
    "plain_refusals": "plain (non-MIG) pod creations refused (a 1.30+ apiserver: 0, matchConditions skip the call)",
    "system_ns_refusals": "creations in gpuops-system refused (namespaceSelector excludes it: 0 expected)",
    "system_ns_mig_pod_unrenamed": "1: a MIG pod in gpuops-system is admitted as is (no rename, no gate), as the "
                                   "manifest documents",
    "restart_to_first_mig_admitted_s": "operator restart -> first MIG pod admitted (includes the caBundle patch)",
}

SHAPES = [["3g.20gb"], ["1g.5gb"], ["2g.10gb", "1g.5gb"], ["1g.10gb"]]


def error_class(message: str) -> str:
    if "connection refused" in message or "connect:" in message:
        return "connection refused"
    if "x509" in message or "certificate" in message or "SSL" in message or "TLS" in message:
        return "TLS (caBundle without the new CA yet)"
    return message[:120]


class Client:
    """A client that re-sends one pod creation every 0.5 s until it is admitted (as a controller retries)."""

    def __init__(self, mr: MigRig, body: dict[str, Any], namespace: str = NS) -> None:
        self.mr = mr
        self.body = body
        self.namespace = namespace
        self.refusals: list[tuple[float, str]] = []
        self.admitted_at: float | None = None

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    async def run(self) -> None:
        while True:
            try:
                await self.mr.create_pod(self.body, self.namespace)
            except RuntimeError as e:
                self.refusals.append((time.monotonic(), str(e)))
                await asyncio.sleep(0.5)  # the client's retry cadence
                continue
            self.admitted_at = time.monotonic()
            return


def unrenamed(pod: dict[str, Any]) -> bool:
    return any(k.startswith(NVIDIA_PREFIX) for c in (pod.get("spec") or {}).get("containers") or []
               for k in ((c.get("resources") or {}).get("limits") or {}))


def renamed(pod: dict[str, Any]) -> bool:
    return any(k.startswith(OUR_PREFIX) for c in (pod.get("spec") or {}).get("containers") or []
               for k in ((c.get("resources") or {}).get("limits") or {})) and not unrenamed(pod)


async def scenario(quick: bool) -> Found:
    problems: list[str] = []
    t0 = time.monotonic()
    outage, mig_n, plain_n, runtime = (5.0, 4, 2, 3.0) if quick else (25.0, 12, 4, 5.0)
    async with open_mig_rig(NAME, nodes=2, grace=3.0) as mr:
        base = [f"base-{i}" for i in range(3)]
        admit_ms = []
        for i, name in enumerate(base):
            t = time.monotonic()
            await mr.create_pod(mr.pod_body(name, SHAPES[i % len(SHAPES)], runtime=runtime))
            admit_ms.append((time.monotonic() - t) * 1000)
        await mr.wait_running(base, 30)

        mr.rig.kill()
        killed = time.monotonic()
        mig = [Client(mr, mr.pod_body(f"mig-{i}", SHAPES[i % len(SHAPES)], runtime=runtime)) for i in range(mig_n)]
        plain = [Client(mr, mr.pod_body(f"plain-{i}", [], runtime=runtime)) for i in range(plain_n)]
        system = [Client(mr, mr.pod_body("sys-mig", ["1g.5gb"], runtime=runtime), SYSTEM_NS),
                  Client(mr, mr.pod_body("sys-plain", [], runtime=runtime), SYSTEM_NS)]
        clients = mig + plain + system
        tasks = [asyncio.create_task(c.run()) for c in clients]
        await pace(outage)
        restarted = time.monotonic()
        await mr.rig.start_operator()
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
        except TimeoutError:
            problems.append("clients still refused 60 s after the restart: "
                            + ", ".join(f"{c.name}: {error_class(c.refusals[-1][1])}" for c in clients
                                        if c.admitted_at is None and c.refusals))
        sys_pods = {c.name: mr.cluster.access.get(("", "pods"), SYSTEM_NS, c.name) for c in system}
        for c in system:  # not ours to run: the MIG one asks for a resource nothing serves
            await mr.cluster.access.delete(("", "pods"), SYSTEM_NS, c.name)

        admitted_in_outage = [c.name for c in mig + plain if c.admitted_at is not None and c.admitted_at < restarted]
        for name in admitted_in_outage:
            if name.startswith("mig-"):
                problems.append(f"MIG pod {name} admitted while the webhook was down")
        for rec in mr.track.pods.values():
            if unrenamed(rec.first):
                problems.append(f"pod {rec.name} stored with nvidia.com/mig-* (the slicer bypassed)")
            if rec.profiles and rec.name.startswith("mig-") and not (is_gated(rec.first) and renamed(rec.first)):
                problems.append(f"MIG pod {rec.name} admitted without the gate or the rename")
        names = [c.name for c in mig + plain if c.admitted_at is not None]
        ran = await mr.wait_running(names, 60)

        def finished() -> bool:
            return all(r.terminal_at is not None for r in mr.track.pods.values())

        await wait_for("every pod finished", finished, 60)
        common = await mr.final_checks(problems)
        after = [t for c in mig for t, _ in c.refusals if t >= restarted]
        classes = Counter(error_class(m) for c in clients for _, m in c.refusals)
        admitted_after = [c.admitted_at for c in mig if c.admitted_at is not None and c.admitted_at >= restarted]
        figures: dict[str, Any] = {
            "outage_s": round(restarted - killed, 3),
            "baseline_admission_ms_max": round(max(admit_ms), 1),
            "mig_pods_tried": len(mig),
            "mig_refusals": sum(len(c.refusals) for c in mig),
            "mig_refusals_after_restart": len(after),
            "mig_admitted_during_outage": sum(1 for n in admitted_in_outage if n.startswith("mig-")),
            "plain_pods_tried": len(plain),
            "plain_refusals": sum(len(c.refusals) for c in plain),
            "plain_admitted_during_outage": sum(1 for n in admitted_in_outage if n.startswith("plain-")),
            "system_ns_refusals": sum(len(c.refusals) for c in system),
            "system_ns_mig_pod_unrenamed": int(bool(sys_pods.get("sys-mig") and unrenamed(sys_pods["sys-mig"] or {}))),
            "restart_to_first_mig_admitted_s": round(min(admitted_after) - restarted, 3) if admitted_after else -1,
            "restart_to_all_mig_admitted_s": round(max(admitted_after) - restarted, 3) if admitted_after else -1,
            "admitted_pods_ran": len(ran),
            **common,
            "run_seconds": round(time.monotonic() - t0, 1),
        }
        if figures["mig_refusals"] == 0:
            problems.append("no MIG pod creation was refused during the outage")
        return mr.verdict(figures, problems, error_classes=dict(classes),
                          sample_error=next((m for c in mig for _, m in c.refusals), ""))


def report(figures: Figures, detail: Detail, args: argparse.Namespace) -> Report:
    if figures["plain_refusals"] == 0:
        plain_text = (f"all {figures['plain_pods_tried']} admitted during the outage without a refusal: this emulator "
                      "evaluated the webhook's matchConditions (no call for a pod that mentions no `/mig-` "
                      "resource), as a 1.30+ apiserver does.")
    else:
        plain_text = (f"refused {figures['plain_refusals']} times: the emulator called the webhook for them, which a "
                      "1.30+ apiserver would not (matchConditions); this differs from a real cluster.")
    classes = "\n".join(f"| {k} | {v} |" for k, v in sorted(detail["error_classes"].items()))
    injected = (f"operator (webhook) killed {figures['outage_s']:.0f} s; clients retrying MIG, plain and "
                "excluded-namespace pods")
    checked = ("MIG pods refused (Fail), none unrenamed; after restart admitted gated+renamed and run; no gated "
               "pod without reason, no leaked slice")
    key = (f"{figures['mig_refusals']} MIG refusals, {figures['mig_admitted_during_outage']} admitted in "
           f"outage, plain pods refused {figures['plain_refusals']}x, first admit "
           f"{figures['restart_to_first_mig_admitted_s']} s after restart")
    md = f"""# MIG slicer: webhook unreachable (operator down) ({mode_of(args)} run)

Operator killed for {figures['outage_s']} s while clients retry pod creations every 0.5 s: MIG and plain pods
in `{NS}`, one of each in `{SYSTEM_NS}` (excluded by the namespaceSelector). Operator restarted; the clients go
on until admitted.

Plain pods: {plain_text}

Sample refusal: `{detail['sample_error'][:400]}`

| refusal class | count |
|---|---|
{classes}"""
    return Report(md, COMMON_NOTES | NOTES, listed=True, injected=injected, checked=checked, key=key)


if __name__ == "__main__":
    run_scenario(NAME, __doc__, lambda args: scenario(args.quick), report)
