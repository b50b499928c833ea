"""Power webhook failing 30 % (500s and timeouts) under the autoprovision controller.

Injected, on the emulated cloud's power API (start and stop), from the first pod until every machine is off
again: four rules of the cloud's fault injector, each firing on 8.5 % of calls (together ~30 %): HTTP 500
before the operation, a hang before it (no answer for 2.5 s, longer than the groups' 1 s webhook timeout),
HTTP 500 *after* the operation took effect, and a hang after it. The last two are the cases the
Idempotency-Key exists for: the machine did power on, the operator saw a failure and must retry with the
same key (the cloud replays the answer), not decide again.

Workload: 6 powered-off 8-GPU machines, one GPUNodeGroup each; a burst of 24 pods of 2 GPUs (10/s), 15 s
each (`--quick`: 5 s); the full run has a second burst once every machine is off again. Compressed
timings: boot 4 s (`--quick` 2 s), device plugin 0.3 s, shutdown 0.3 s,
scaleDownUnneededSeconds 4 s (`--quick` 2 s), scaleDownDelayAfterScaleUpSeconds 0.

Checked (chaos/_autoprovision.py `power_report`, from the cloud's own record of every request): every pod
Running eventually; no duplicate transition (a new Idempotency-Key for a start while the machine is already
booting or on, or for a stop while it is going down or off); every key sent was decided by the operator; no
machine powered on more often than decided; every machine powered off and every group Off in the end.
"""

from __future__ import annotations

import argparse

from _autoprovision import ApRig, burst, open_ap_rig, power_report
from _common import Detail, Figures, Found, Report, mode_of, run_scenario

NAME = "autoprovision_webhook_faults"
NOTES = {
    "webhook_requests": "power API start/stop requests received by the cloud (all attempts)",
    "webhook_requests_replayed": "answered from the Idempotency-Key store (a retry of a transition that took effect)",
    "faults_injected": "the cloud's fault injector: 500s and hangs, before or after the operation",
    "webhook_failure_fraction": "requests not answered 2xx (hangs end in 504 after the client gave up)",
    "duplicate_transitions": "new key for a start while booting/on or a stop while going down/off (must be 0)",
    "undecided_keys_sent": "requests whose key the operator never logged as decided (must be 0)",
    "power_cycles": "power-ons the machines went through (must not exceed power_on_decisions)",
    "seconds_to_all_pods_running": "first pod created -> last pod first Running (first burst)",
    "decision_to_first_request_seconds_max": "operator's decision log record -> its first power request (worst)",
    "machines_powered_on_that_ran_no_pod": "power-ons no pod ever used (the burst went elsewhere meanwhile)",
    "seconds_to_all_machines_off": "first pod created -> every machine off and every group Off",
}

MACHINES, PODS, GPUS, SPACING = 6, 24, 2, 0.1
RULE_RATE = 1 - 0.7 ** 0.25  # four independent rules: 30 % of calls fail
HANG = 2.5
WEBHOOK_TIMEOUT = 1


def inject(ap: ApRig) -> None:
    faults = ap.cluster.cloud.faults
    faults.add(api="power", status=500, rate=RULE_RATE)
    faults.add(api="power", hang=True, hang_seconds=HANG, rate=RULE_RATE)
    faults.add(api="power", status=500, rate=RULE_RATE, after=True)
    faults.add(api="power", hang=True, hang_seconds=HANG, rate=RULE_RATE, after=True)


async def scenario(quick: bool, seed: int) -> Found:
    first: dict[str, float] = {}
    boot, runtime, unneeded = (2.0, 5.0, 2) if quick else (4.0, 15.0, 4)
    names = [f"gpu-{i}" for i in range(MACHINES)]
    async with open_ap_rig("chaos-ap-webhook", MACHINES, seed=seed, boot=boot) as ap:
        await ap.create_groups(names, unneeded=unneeded, webhook_timeout=WEBHOOK_TIMEOUT)
        inject(ap)
        problems: list[str] = []
        waves = 2  # the second burst wakes machines that were powered off (a regression once: never woken again)
        for wave in range(waves):  # a second burst once everything is off again (twice the transitions)
            start = await burst(ap, PODS, GPUS, runtime, SPACING, prefix=f"w{wave}")
            try:
                running_at = await ap.wait_all_running(120 if wave == 0 and not quick else 40)
            except TimeoutError as e:
                taints = {n: [t["key"] for t in ((ap.cluster.access.get(("", "nodes"), "", n) or {}).get("spec") or {})
                              .get("taints") or ()] for n in names}
                problems.append(f"wave {wave}: {e}: {sum(1 for p in ap.pods.values() if p.running is None)} pods "
                                f"pending, decisions so far {len(ap.decisions())}, groups "
                                f"{[(n, ap.state(n)) for n in names]}, taints of their (NotReady) Nodes {taints}")
                break
            try:
                off_at = await ap.wait_all_off(names, runtime + 40 if quick else runtime + 90)
            except TimeoutError as e:
                states = [(n, ap.state(n), ap.machines[n].state) for n in names]
                problems.append(f"wave {wave}: {e}: states {states}")
                break
            if wave == 0:
                first["seconds_to_all_pods_running"] = round(running_at - start, 3)
                first["seconds_to_all_machines_off"] = round(off_at - start, 3)
            else:
                first[f"wave{wave}_seconds_to_all_pods_running"] = round(running_at - start, 3)
                first[f"wave{wave}_seconds_to_all_machines_off"] = round(off_at - start, 3)
        ap.cluster.cloud.faults.clear()
        figures, per, power_problems = power_report(ap, names)
        problems += power_problems
        injected = sum(ap.cluster.cloud.faults.injected.values())
        calls = [c for c in ap.calls if c.machine in names]
        failed = sum(1 for c in calls if not 200 <= c.status < 300)
        if injected == 0:
            problems.append("no fault was injected: the scenario tested nothing")
        figures = {
            **figures,
            "faults_injected": injected,
            "webhook_requests_failed": failed,
            "webhook_failure_fraction": round(failed / len(calls), 3) if calls else 0.0,
            "hangs_injected": sum(n for (_, _, f), n in ap.cluster.cloud.faults.injected.items() if f == "hang"),
            "pods": len(ap.pods),
            "pods_never_running": sum(1 for p in ap.pods.values() if p.running is None),
            "seconds_to_all_pods_running": first.get("seconds_to_all_pods_running", -1),
            "seconds_to_all_machines_off": first.get("seconds_to_all_machines_off", -1),
            **{k: v for k, v in first.items() if k.startswith("wave")},
            "machines_used": sum(1 for n in names if ap.machines[n].power_cycles > 0),
        }
        detail = {"machines": per, "problems": problems, "trace": ap.trace(),
                  "cloud_faults": ap.cluster.cloud.faults.describe()["injected"],
                  "timings": {"boot_seconds": boot, "pod_runtime_seconds": runtime,
                              "scale_down_unneeded_seconds": unneeded, "webhook_timeout_seconds": WEBHOOK_TIMEOUT,
                              "hang_seconds": HANG}}
        return figures, detail, not problems


def report(figures: Figures, detail: Detail, args: argparse.Namespace) -> Report:
    rows = "\n".join(f"| {n} | {d['power_cycles']} | {d['up_decisions']} | {d['down_decisions']} | "
                     f"{d['start_requests']} / {d['start_keys']} | {d['stop_requests']} / {d['stop_keys']} | "
                     f"{d['replayed']} | {len(d['duplicates'])} |" for n, d in detail["machines"].items())
    t = detail["timings"]
    injected = (f"power API 500s + hangs (> webhook timeout), before/after the op, ~30 % of calls; {PODS} pods "
                f"x {GPUS} GPUs over {MACHINES} off machines (compressed: boot {t['boot_seconds']:g} s)")
    checked = "all pods Running; 0 duplicate transitions; keys all decided; cycles <= decisions; all off"
    key = (f"{figures['webhook_requests']} requests, {figures['faults_injected']} faults, "
           f"{figures['duplicate_transitions']} duplicates; running after "
           f"{figures['seconds_to_all_pods_running']:g} s, all off after "
           f"{figures['seconds_to_all_machines_off']:g} s")
    md = f"""# Autoprovision: power webhook failing 30 % with 500s and timeouts ({mode_of(args)} run)

Injected on the emulated power API (start and stop): 500 before the operation, hang before it ({HANG:g} s,
webhook timeout {WEBHOOK_TIMEOUT} s), 500 after it took effect, hang after it; each {RULE_RATE:.1%} of calls
(~30 % together). Workload: {PODS} pods x {GPUS} GPUs over {MACHINES} powered-off 8-GPU machines \
(two bursts, the second once every machine is off again). Compressed
timings: boot {t['boot_seconds']:g} s, pod runtime {t['pod_runtime_seconds']:g} s, scaleDownUnneededSeconds
{t['scale_down_unneeded_seconds']} s.

Checked: every pod Running; no duplicate transition (new Idempotency-Key while the transition is under way);
every key sent decided by the operator; power-ons <= decisions; every machine off and every group Off at the end.

| machine | power cycles | up decisions | down decisions | start requests / keys | stop requests / keys | \
replayed | duplicates |
|---|---|---|---|---|---|---|---|
{rows}"""
    return Report(md, NOTES, injected=injected, checked=checked, key=key)


if __name__ == "__main__":
    run_scenario(NAME, __doc__, lambda args: scenario(args.quick, args.seed), report)
