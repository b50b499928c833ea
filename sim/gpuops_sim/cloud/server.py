"""The emulated cloud's HTTP server: power API, spot API, and the `/sim/cloud` control endpoints.

Every API call passes the same gate: bearer token, injected faults (before and after the operation),
and a call counter by (api, op, HTTP status) for reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import msgspec
import structlog
from aiohttp import web

from gpuops_sim.cluster.machines import Fleet

from .config import CloudOptions, InstanceType, default_instance_types
from .errors import CloudError, bad, json_response
from .faults import CloudFaults
from .loopback import LoopbackServer
from .power import PowerAPI, machine_json
from .spot import LaunchRequest, SpotCloud

log = structlog.get_logger("gpuops_sim.cloud")

Handler = Callable[[web.Request], Awaitable[web.Response]]
MAX_RESULTS = 1000


class CloudServer(LoopbackServer):
    """An aiohttp server on loopback that powers fleet machines and sells spot instances that join it."""

    def __init__(self, fleet: Fleet, *, host: str = "127.0.0.1", port: int = 0,
                 instance_types: list[InstanceType] | None = None, options: CloudOptions | None = None,
                 zone: str = "sim-zone-a") -> None:
        super().__init__(host, port)
        self.fleet = fleet
        self.options = options or CloudOptions()
        self.zone = zone
        types = default_instance_types() if instance_types is None else instance_types
        if len({t.name for t in types}) != len(types):
            raise ValueError("instance type names must be unique")
        self.spot = SpotCloud(fleet, {t.name: t for t in types}, self.options, zone)
        self.power = PowerAPI(fleet, managed=lambda n: n not in self.spot.machine_names,
                              idempotency_seconds=self.options.idempotency_seconds)
        self.faults = CloudFaults(self.options.seed)
        self.calls: Counter[tuple[str, str, int]] = Counter()  # (api, op, HTTP status); 0: no answer
        self.errors: Counter[tuple[str, str, str]] = Counter()  # (api, op, error code)

    # ------------------------------------------------------------------------------------ lifecycle

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._json_errors])
        r = app.router
        r.add_post("/power/v1/machines/{name}/start", self._api("power", "start", self._power_start))
        r.add_post("/power/v1/machines/{name}/stop", self._api("power", "stop", self._power_stop))
        r.add_get("/power/v1/machines/{name}", self._api("power", "get", self._power_get))
        r.add_get("/power/v1/machines", self._api("power", "list", self._power_list))
        r.add_post("/spot/v1/instances", self._api("spot", "run", self._spot_run))
        r.add_get("/spot/v1/instances", self._api("spot", "describe", self._spot_describe))
        r.add_post("/spot/v1/instances/terminate", self._api("spot", "terminate", self._spot_terminate))
        r.add_post("/sim/cloud/reclaim", self._control(self._reclaim))
        r.add_get("/sim/cloud/faults", self._control(self._faults_get))
        r.add_post("/sim/cloud/faults", self._control(self._faults_add))
        r.add_delete("/sim/cloud/faults", self._control(self._faults_clear))
        r.add_delete("/sim/cloud/faults/{id}", self._control(self._faults_remove))
        r.add_get("/sim/cloud/instance-types", self._control(self._types_get))
        r.add_post("/sim/cloud/capacity", self._control(self._capacity_set))
        r.add_post("/sim/cloud/launch-failures", self._control(self._launch_failures_set))
        r.add_get("/sim/cloud/stats", self._control(self._stats_get))
        return app

    def started(self) -> None:
        log.info("cloud listening", url=self.url, zone=self.zone, instance_types=sorted(self.spot.types))

    def stopped(self) -> None:
        self.spot.close()

    # ------------------------------------------------------------------------------------ Python API

    def reclaim(self, instance_ids: Iterable[str] | int | None = None, *, count: int | None = None,
                tags: dict[str, str] | None = None, notice_seconds: float | None = None) -> list[str]:
        """Interruption notices for these instances (or `count` random running ones with `tags`)."""
        if isinstance(instance_ids, int):
            count, instance_ids = instance_ids, None
        ids = None if instance_ids is None else list(instance_ids)
        return self.spot.reclaim(ids, count=count, tags=tags, notice_seconds=notice_seconds)[0]

    def set_capacity(self, instance_type: str, capacity: int | None) -> None:
        self.spot.set_capacity(instance_type, capacity)

    def stats(self) -> dict[str, Any]:
        return {
            "calls": [{"api": a, "op": o, "status": s, "count": n} for (a, o, s), n in sorted(self.calls.items())],
            "errors": [{"api": a, "op": o, "code": c, "count": n} for (a, o, c), n in sorted(self.errors.items())],
            "faults": self.faults.describe()["injected"],
            "instances": dict(Counter(i.state for i in self.spot.instances.values())),
            "launched": self.spot.launched,
            "reclaimed": self.spot.reclaimed,
        }

    # ------------------------------------------------------------------------------------ the gate

    def _api(self, api: str, op: str, fn: Handler) -> Handler:
        async def handle(request: web.Request) -> web.Response:
            status = 0
            try:
                self._authorize(request)
                await self._inject(api, op, after=False)
                resp = await fn(request)
                await self._inject(api, op, after=True)
                status = resp.status
                return resp
            except CloudError as e:
                status = e.status
                self.errors[(api, op, e.code)] += 1
                return e.response()
            except Exception:
                log.exception("cloud call failed", api=api, op=op, path=request.path)
                status = 500
                self.errors[(api, op, "InternalError")] += 1
                return CloudError(500, "InternalError", "internal error of the emulated cloud").response()
            finally:
                self.calls[(api, op, status)] += 1

        return handle

    def _control(self, fn: Handler) -> Handler:
        async def handle(request: web.Request) -> web.Response:
            try:
                return await fn(request)
            except CloudError as e:
                return e.response()
            except ValueError as e:
                return bad(str(e)).response()

        return handle

    @web.middleware
    async def _json_errors(self, request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """Unknown paths and methods answer in the API's error shape, not aiohttp's text."""
        try:
            return await handler(request)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            code = {404: "NotFound", 405: "MethodNotAllowed"}.get(e.status, "InvalidRequest")
            return CloudError(e.status, code, f"{request.method} {request.path}: {e.reason}").response()

    def _authorize(self, request: web.Request) -> None:
        token = self.options.token
        if token is None:
            return
        got = request.headers.get("Authorization", "")
        scheme, _, value = got.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), token.encode()):
            raise CloudError(401, "AuthFailure", "missing or invalid bearer token")

    async def _inject(self, api: str, op: str, *, after: bool) -> None:
        out = self.faults.roll(api, op, after=after)
        if out.delay > 0:
            await self._wait(out.delay)
        rule = out.rule
        if rule is None:
            return
        if rule.hang:
            log.info("fault: hang", api=api, op=op, seconds=rule.hang_seconds)
            await self._wait(rule.hang_seconds)
            raise CloudError(504, "GatewayTimeout", "injected hang ended")
        err = rule.to_error()
        log.info("fault: error", api=api, op=op, status=err.status, code=err.code, after=after)
        raise err

    async def _wait(self, seconds: float | None) -> None:
        """Sleep, cut short when the server stops so shutdown never waits for a hung call."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), seconds)

    # ------------------------------------------------------------------------------------ power API

    async def _power_start(self, request: web.Request) -> web.Response:
        return await self._power_change(request, "start")

    async def _power_stop(self, request: web.Request) -> web.Response:
        return await self._power_change(request, "stop")

    async def _power_change(self, request: web.Request, op: str) -> web.Response:
        await _body(request)  # `{}` or empty; malformed JSON is still an error
        name = request.match_info["name"]
        key = request.headers.get("Idempotency-Key")
        fingerprint = f"{op} {name}"
        if key is not None:
            if not 0 < len(key) <= 255:
                raise bad("Idempotency-Key must be 1-255 characters")
            prior = self.power.replay(key, fingerprint)
            if prior is not None:
                return json_response(prior[1], prior[0], headers={"Idempotent-Replayed": "true"})
        status, body = self.power.start(name) if op == "start" else self.power.stop(name)
        if key is not None:
            self.power.remember(key, fingerprint, status, body)
        return json_response(body, status)

    async def _power_get(self, request: web.Request) -> web.Response:
        return json_response(machine_json(self.power.machine(request.match_info["name"])))

    async def _power_list(self, request: web.Request) -> web.Response:
        return json_response({"machines": self.power.list(request.query.get("group"))})

    # ------------------------------------------------------------------------------------ spot API

    async def _spot_run(self, request: web.Request) -> web.Response:
        req = LaunchRequest.from_json(await _body(request))
        instances, _created = self.spot.run(req)
        return json_response({"instances": [i.to_json() for i in instances]})

    async def _spot_describe(self, request: web.Request) -> web.Response:
        filters: dict[str, list[str]] = {}
        for k, v in request.query.items():
            if k not in ("maxResults", "nextToken"):
                filters.setdefault(k, []).append(v)
        found = self.spot.describe(filters)
        limit = _int_param(request.query.get("maxResults"), "maxResults", 1, MAX_RESULTS, default=MAX_RESULTS)
        offset = _int_param(request.query.get("nextToken"), "nextToken", 0, len(found), default=0)
        page = found[offset:offset + limit]
        body: dict[str, Any] = {"instances": [i.to_json() for i in page]}
        if offset + limit < len(found):
            body["nextToken"] = str(offset + limit)
        return json_response(body)

    async def _spot_terminate(self, request: web.Request) -> web.Response:
        body = await _body(request)
        ids = body.get("instanceIds") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
            raise bad("instanceIds must be a non-empty list of strings", "MissingParameter")
        done, missing = self.spot.terminate(ids)
        return json_response({
            "terminatingInstances": [
                {"instanceId": i.id, "previousState": prev, "currentState": i.state} for i, prev in done],
            "notFound": missing,
        })

    # ------------------------------------------------------------------------------------ control

    async def _reclaim(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if not isinstance(body, dict) or set(body) - {"instanceIds", "count", "tags", "noticeSeconds"}:
            raise bad("body: {instanceIds: [...]} or {count: n, tags: {...}}, optional noticeSeconds")
        ids = body.get("instanceIds")
        if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
            raise bad("instanceIds must be a list of strings")
        count, tags, notice = body.get("count"), body.get("tags"), body.get("noticeSeconds")
        if ids is None and not (isinstance(count, int) and not isinstance(count, bool)):
            raise bad("reclaim needs instanceIds or an integer count")
        if tags is not None and not isinstance(tags, dict):
            raise bad("tags must be an object")
        if notice is not None and not isinstance(notice, int | float):
            raise bad("noticeSeconds must be a number")
        done, missing = self.spot.reclaim(ids, count=count, tags=tags, notice_seconds=notice)
        return json_response({"instanceIds": done, "notFound": missing})

    async def _faults_get(self, request: web.Request) -> web.Response:
        return json_response(self.faults.describe())

    async def _faults_add(self, request: web.Request) -> web.Response:
        rule = self.faults.add_json(await _body(request))
        return json_response(rule.to_json(), 201)

    async def _faults_clear(self, request: web.Request) -> web.Response:
        self.faults.clear()
        return json_response(self.faults.describe())

    async def _faults_remove(self, request: web.Request) -> web.Response:
        rid = request.match_info["id"]
        if not rid.isdigit() or not self.faults.remove(int(rid)):
            raise CloudError(404, "NotFound", f"no fault rule {rid!r}")
        return json_response(self.faults.describe())

    async def _types_get(self, request: web.Request) -> web.Response:
        return json_response({"instanceTypes": [
            {"name": t.name, "gpuModel": t.gpu_model, "gpus": t.gpus, "cpu": t.cpu, "memory": t.memory,
             "capacity": t.capacity, "inUse": self.spot.used[t.name]} for t in self.spot.types.values()]})

    async def _capacity_set(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if not isinstance(body, dict) or not isinstance(body.get("instanceType"), str) or "capacity" not in body:
            raise bad("body: {instanceType: str, capacity: int | null}")
        self.spot.set_capacity(body["instanceType"], body["capacity"])
        return await self._types_get(request)

    async def _launch_failures_set(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if not isinstance(body, dict) or "rate" not in body:
            raise bad("body: {rate: number from 0 to 1}")
        self.spot.set_launch_failure_rate(body["rate"])
        return json_response({"rate": self.spot.launch_failure_rate})

    async def _stats_get(self, request: web.Request) -> web.Response:
        return json_response(self.stats())


async def _body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as e:
        raise bad(f"request body is not valid JSON: {e}", "InvalidRequest") from None


def _int_param(raw: str | None, name: str, lo: int, hi: int, *, default: int) -> int:
    if raw is None:
        return default
    if not raw.isdigit() or not lo <= int(raw) <= hi:
        raise bad(f"{name} must be an integer from {lo} to {hi}")
    return int(raw)
