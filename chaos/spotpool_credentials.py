"""Wrong cloud credentials in the pool's Secret, then fixed: twice (from the start, and while running).

Rig (chaos/_spotpool.py): the emulated cloud requires a bearer token (`cloud.options.token`); the pool names
the Secret gpuops-system/cloud (`spec.credentialsSecretRef`, key `token`). `--spotpool-resync 2`
(`--quick`) or 5: the Secret is not watched, so a change of it is seen at the next reconcile.

  A. The pool is created while the Secret holds a wrong token; held broken for 10 s (`--quick`) or 30 s;
     then the Secret is fixed.
  B. Once the pool is at its minimum Ready, the Secret is broken again; once CredentialsInvalid=True, one
     instance is reclaimed (notice 3 s: the pool needs a replacement it cannot launch); held broken as long
     as in A, then fixed.

Checked, for each broken window (from the write that broke the Secret to the write that fixed it):
CredentialsInvalid=True is reached; no launch request reaches the cloud; no hot loop: spot API requests in
the window <= 1 + window / resync (at most one per resync period beyond the first refusal; measured from the
cloud's own request counter, every answer counted, 401s included). After each fix: the pool at its minimum
Ready (B: the reclaimed instance replaced) and CredentialsInvalid=False.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

from _common import Detail, Figures, Found, Report, mode_of, run_scenario, wait_for
from _spotpool import SpotRig, open_spot_rig, sleep_until

NAME = "spotpool_credentials"
NOTES = {
    "A_calls_while_broken": "spot API requests while the Secret was wrong (A: pool created broken)",
    "A_calls_bound": "1 + window / resync: the most allowed (one per resync beyond the first refusal)",
    "B_calls_while_broken": "spot API requests while the Secret was wrong (B: broken while running, a reclaim)",
    "B_run_calls_while_broken": "launch requests while the Secret was wrong (must be 0)",
    "B_fix_to_minimum_ready_s": "Secret fixed -> pool at minimum Ready (the reclaimed instance replaced)",
    "cloud_401_answers": "requests the cloud refused (whole run)",
}

TOKEN = "s3cret-token"
WRONG = "not-the-token"
SECRET = "cloud"
MINIMUM, MAXIMUM = 3, 4


def cloud_requires_token(cluster: Any) -> None:
    cluster.cloud.options.token = TOKEN


def invalid(sr: SpotRig, value: str) -> bool:
    c = sr.condition("CredentialsInvalid")
    return c is not None and c.get("status") == value


async def broken_window(sr: SpotRig, label: str, hold: float, problems: list[str], *,
                        create: bool, reclaim: bool) -> dict[str, Any]:
    info: dict[str, Any] = {"window": label}
    calls0, runs0, launched0 = sr.spot_calls(), sr.run_calls(), sr.spot.launched
    broke = time.monotonic()
    await sr.put_secret(SECRET, WRONG)
    if create:
        await sr.create_pool(MINIMUM, MAXIMUM, credentialsSecretRef={"name": SECRET, "namespace": "gpuops-system"},
                             insecureAllowHTTP=True)  # the emulated cloud is plain http on loopback
    try:
        seen = await wait_for(f"{label}: CredentialsInvalid=True", lambda: invalid(sr, "True"), 3 * sr.resync + 10)
        info["broken_to_condition_s"] = round(seen - broke, 3)
        c = sr.condition("CredentialsInvalid") or {}
        info["reason"] = c.get("reason")
    except TimeoutError as e:
        problems.append(str(e))
    if reclaim:
        victim = sorted((i for i in sr.led.ready() if i.interruption is None), key=lambda i: i.launch_time)[0]
        sr.cluster.cloud.reclaim([victim.id], notice_seconds=3.0)
        info["reclaimed"] = victim.id
    await sleep_until(broke + hold)  # the scenario's timeline: the Secret stays wrong this long
    invalid_at_fix = invalid(sr, "True")
    fixed = time.monotonic()
    window = fixed - broke
    await sr.put_secret(SECRET, TOKEN)
    info["window_s"] = round(window, 3)
    info["calls_while_broken"] = sr.spot_calls() - calls0
    info["run_calls_while_broken"] = sr.run_calls() - runs0
    info["instances_launched_while_broken"] = sr.spot.launched - launched0
    info["calls_bound"] = 1 + math.floor(window / sr.resync)
    info["invalid_at_fix"] = invalid_at_fix
    if not invalid_at_fix:
        problems.append(f"{label}: CredentialsInvalid was not True when the Secret was fixed")
    if info["run_calls_while_broken"] or info["instances_launched_while_broken"]:
        problems.append(f"{label}: {info['run_calls_while_broken']} launch requests, "
                        f"{info['instances_launched_while_broken']} instances while the token was wrong")
    if info["calls_while_broken"] > info["calls_bound"]:
        problems.append(f"{label}: {info['calls_while_broken']} cloud requests in {window:.1f} s broken "
                        f"(bound {info['calls_bound']}: a hot loop)")
    try:
        valid = await wait_for(f"{label}: CredentialsInvalid=False after the fix", lambda: invalid(sr, "False"),
                               3 * sr.resync + 15)
        info["fix_to_condition_false_s"] = round(valid - fixed, 3)
        done = await sr.wait_converged(f"{label}: minimum Ready after the fix", 60)
        info["fix_to_minimum_ready_s"] = round(done - fixed, 3)
    except TimeoutError as e:
        st = sr.status()
        problems.append(f"{e} (size {st.get('size')}, ready {st.get('ready')}, lastError {st.get('lastError')!r})")
    return info


async def scenario(quick: bool, seed: int) -> Found:
    resync, hold = (2.0, 10.0) if quick else (5.0, 30.0)
    problems: list[str] = []
    windows: list[dict[str, Any]] = []
    async with open_spot_rig("chaos-spot-creds", seed=seed, resync=resync, notice=3.0, minimum=MINIMUM,
                             configure=cloud_requires_token) as sr:
        windows.append(await broken_window(sr, "A (from the start)", hold, problems, create=True, reclaim=False))
        if not problems:
            windows.append(await broken_window(sr, "B (while running, with a reclaim)", hold, problems,
                                               create=False, reclaim=True))
        refused = sum(n for (a, _, s), n in sr.cluster.cloud.calls.items() if a == "spot" and s == 401)
        figures: dict[str, float | int] = {"resync_seconds": resync, "hold_seconds": hold,
                                           "cloud_401_answers": refused, "instances_created": sr.led.created(),
                                           "duplicates": max(0, sr.led.created() - MINIMUM - len(sr.led.noticed))}
        for key, w in zip("AB", windows, strict=False):
            for k in ("window_s", "calls_while_broken", "calls_bound", "run_calls_while_broken",
                      "instances_launched_while_broken", "broken_to_condition_s", "fix_to_condition_false_s",
                      "fix_to_minimum_ready_s"):
                if k in w:
                    figures[f"{key}_{k}"] = w[k]
        if figures["duplicates"]:
            problems.append(f"{figures['duplicates']} instances created beyond minimum + reclaimed")
        return figures, {"problems": problems, "windows": windows}, not problems


def report(figures: Figures, detail: Detail, args: argparse.Namespace) -> Report:
    rows = "\n".join(f"| {w['window']} | {w.get('window_s', '-')} | {w.get('reason', '-')} | "
                     f"{w.get('calls_while_broken', '-')} (bound {w.get('calls_bound', '-')}) | "
                     f"{w.get('run_calls_while_broken', '-')} | {w.get('fix_to_condition_false_s', '-')} | "
                     f"{w.get('fix_to_minimum_ready_s', '-')} |" for w in detail["windows"])
    injected = (f"wrong bearer token in the pool's Secret for {figures['hold_seconds']:g} s, twice (at creation; "
                "while running + a reclaim), then fixed")
    checked = "CredentialsInvalid=True, 0 launches, requests <= 1 + window/resync, recovery to minimum Ready"
    key = (f"requests while broken A {figures.get('A_calls_while_broken', '-')}/"
           f"{figures.get('A_calls_bound', '-')}, B {figures.get('B_calls_while_broken', '-')}/"
           f"{figures.get('B_calls_bound', '-')} (bound); fix -> minimum Ready "
           f"{figures.get('A_fix_to_minimum_ready_s', '-')} / {figures.get('B_fix_to_minimum_ready_s', '-')} s")
    md = f"""# Spot pool: wrong cloud credentials, then fixed ({mode_of(args)} run)

The emulated cloud requires a bearer token; the pool's Secret holds a wrong one (A: from the pool's creation;
B: broken while the pool runs, then one instance reclaimed), held {figures['hold_seconds']:g} s, then fixed.
`--spotpool-resync {figures['resync_seconds']:g}`.

Checked per broken window: CredentialsInvalid=True; no launch request; spot API requests <= 1 + window /
resync (no hot loop); after the fix CredentialsInvalid=False and the pool at minimum Ready.

| window | broken (s) | reason | cloud requests while broken | launch requests | fix -> condition False (s) | \
fix -> minimum Ready (s) |
|---|---|---|---|---|---|---|
{rows}"""
    return Report(md, NOTES, injected=injected, checked=checked, key=key)


if __name__ == "__main__":
    run_scenario(NAME, __doc__, lambda args: scenario(args.quick, args.seed), report)
