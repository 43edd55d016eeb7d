"""``/api/v1/rollouts``: list, create (or dry-run, or schedule), status with waves and gates, pause/resume/abort/
retry-failed, and a second operator's approve/reject of a rollout awaiting approval."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgecore.errors import NotFoundError, UserError
from edgectl.api.context import ApiContext
from edgectl.api.router import MAX_INT, ApiError, Param, Request, Response, Route
from edgectl.controller.accounts import Role
from edgectl.controller.gates import parse_duration, parse_gate, parse_rate
from edgectl.controller.planner import parse_waves
from edgectl.controller.records import RolloutRow, RolloutStatus
from edgectl.fleet import (
    ApprovalRefused,
    FleetRequest,
    approve_rollout,
    deploy_uploaded,
    reject_rollout,
    request_action,
    rollout_status,
    rollout_summary,
)
from edgectl.fleet.approvals import MAX_REASON, reject_reason

__all__ = ["CREATE_SCHEMA", "rollout_routes"]

CREATE_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["packages", "selector"],
    "properties": {
        "packages": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1},
                     "description": "Variant ids of uploaded packages (GET /api/v1/packages), one per target."},
        "selector": {"type": "string", "minLength": 1,
                     "description": "Devices: k=v[,k=v], all, or group:NAME (a device group, resolved now: GET /api/v1/groups)."},
        "waves": {"type": "string", "description": "Cumulative wave sizes, counts or percentages.",
                  "default": "1,10%,50%,100%"},
        "max_failure": {"type": "string", "description": "Install failure rate that halts a wave.", "default": "5%"},
        "bake": {"type": "string", "description": "Time a wave runs with all gates holding before the next.",
                 "default": "10m"},
        "gates": {"type": "array", "items": {"type": "string"}, "description": "Gate expressions, e.g. 'p95_latency <= 1.2x'."},
        "shadow": {"type": "boolean", "description": "Shadow run on the first wave (gate agreement >= 0.99 unless given)."},
        "allow_downgrade": {"type": "boolean", "description": "Let devices install a lower version."},
        "allow_no_data": {"type": "boolean", "description": "Promote a baked wave even when a gate has no data "
                          "(recorded in the rollout); without it such a wave waits for data, then halts."},
        "max_per_minute": {"type": "integer", "minimum": 0, "maximum": 1_000_000, "default": 0,
                           "description": "Pacing: desired states sent a minute within a wave, evenly spaced (0: the whole "
                                          "wave at once), as `edgectl deploy --fleet --max-per-minute`."},
        "dry_run": {"type": "boolean", "description": "Return the plan; record nothing."},
        "start_at": {"type": "string", "format": "date-time",
                     "description": "Start time, ISO 8601 with an offset (e.g. 2026-11-28T02:00:00+01:00), after the "
                                    "controller's clock: the rollout is `scheduled` until then."},
        "deadline": {"type": "string", "format": "date-time",
                     "description": "Forced-update deadline, ISO 8601 with an offset, after the start: from then on the "
                                    "maintenance windows of the devices' groups no longer hold them back."},
    },
}
REJECT_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["reason"],
    "properties": {"reason": {"type": "string", "minLength": 1, "maxLength": MAX_REASON,
                              "description": "Why, in one line (kept in the audit log and the rollout's reason)."}},
}
ACTIONS = {
    "pause": "Stop starting and promoting waves; devices updating finish.",
    "resume": "Continue a paused rollout.",
    "abort": "Stop for good: unsent devices never get it, devices that took it roll back.",
    "retry-failed": "Send the update again to the failed devices of started waves.",
}
LIST_PARAMS = (
    Param("status", "string", "Only rollouts in this status (repeatable).", enum=tuple(s.value for s in RolloutStatus),
          repeat=True),
    Param("limit", "integer", "Page size.", minimum=1, maximum=1000, default=100),
    Param("offset", "integer", "Rollouts to skip (newest first).", minimum=0, maximum=MAX_INT, default=0),
)


def _checked(field: str, check: Callable[[], object]) -> None:
    try:
        check()
    except UserError as exc:
        raise ApiError(400, str(exc), field) from None


def fleet_request(body: dict[str, Any], packages: list[Path]) -> FleetRequest:
    """The body as :class:`FleetRequest`; each value parsed here first so that a 400 names its field."""
    request = FleetRequest(packages, body["selector"], body.get("waves", "1,10%,50%,100%"), body.get("max_failure", "5%"),
                           body.get("bake", "10m"), tuple(body.get("gates", ())), body.get("shadow", False),
                           body.get("allow_downgrade", False), body.get("dry_run", False),
                           max_per_minute=body.get("max_per_minute", 0), allow_no_data=body.get("allow_no_data", False),
                           start_at=body.get("start_at"), deadline=body.get("deadline"))
    _checked("waves", lambda: parse_waves(request.waves))
    _checked("max_failure", lambda: parse_rate(request.max_failure, "max_failure"))
    _checked("bake", lambda: parse_duration(request.bake, "bake"))
    for i, gate in enumerate(request.gates):
        _checked(f"gates[{i}]", lambda gate=gate: parse_gate(gate))  # type: ignore[misc]
    return request


def rollout_routes(ctx: ApiContext) -> list[Route]:
    def list_rollouts(request: Request) -> Response:
        wanted = request.values["status"] or None
        with ctx.timer.time("rollouts"):
            rows = sorted(ctx.store.rollouts(wanted), key=lambda r: r.created, reverse=True)
            page = rows[request.values["offset"]:request.values["offset"] + request.values["limit"]]
            summaries = [rollout_summary(ctx.store, r.id) for r in page]
        items = [{k: v for k, v in s.items() if k not in ("devices", "skipped")}
                 | {"device_counts": dict(Counter(d["status"] for d in s["devices"]))} for s in summaries]
        return Response(200, {"total": len(rows), "limit": request.values["limit"], "offset": request.values["offset"],
                              "rollouts": items})

    def create_rollout(request: Request) -> Response:
        body: dict[str, Any] = request.values["body"]
        uploaded = {p.ref.variant: p.ref for p in ctx.store.packages()}
        paths = []
        for i, variant in enumerate(body["packages"]):
            if variant not in uploaded:
                raise ApiError(400, f"packages[{i}]: no uploaded package with variant {variant!r} (POST /api/v1/packages)",
                               f"packages[{i}]")
            paths.append(Path(uploaded[variant].path))
        fleet = fleet_request(body, paths)
        try:
            plan, rollout_id = deploy_uploaded(fleet, ctx.store, ctx.trusted(), ctx.wave_timeout_s, request.actor,
                                               ctx.approval_min_devices)
        except UserError as exc:
            field = next((f for f in ("selector", "start_at", "deadline") if str(exc).startswith(f)), None)
            raise ApiError(400, str(exc), field) from None
        return Response(201 if rollout_id else 200, {"rollout_id": rollout_id, "dry_run": fleet.dry_run, "plan": plan.to_dict()})

    def show_rollout(request: Request) -> Response:
        with ctx.timer.time("rollout_status"):
            status = rollout_status(ctx.store, request.path_params["rollout_id"])
        return Response(200, status)

    def action(name: str) -> Callable[[Request], Response]:
        def run(request: Request) -> Response:
            rollout_id = request.path_params["rollout_id"]
            try:
                request_action(ctx.store, rollout_id, name, actor=request.actor)
            except NotFoundError:
                raise
            except UserError as exc:  # it does not apply in the rollout's status now
                raise ApiError(409, str(exc)) from None
            return Response(202, {"rollout_id": rollout_id, "requested": name})
        return run

    def approve(request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        rollout = _decided(lambda: approve_rollout(ctx.store, rollout_id, request.actor))
        return Response(200, {"rollout_id": rollout_id, "status": rollout.status.value, "approved_by": request.actor})

    def reject(request: Request) -> Response:
        rollout_id = request.path_params["rollout_id"]
        reason = request.values["body"]["reason"]
        _checked("reason", lambda: reject_reason(reason))
        rollout = _decided(lambda: reject_rollout(ctx.store, rollout_id, request.actor, reason))
        return Response(200, {"rollout_id": rollout_id, "status": rollout.status.value, "reason": rollout.reason})

    routes = [
        Route("GET", "/api/v1/rollouts", Role.VIEWER, "List rollouts, newest first, with device counts.", list_rollouts,
              LIST_PARAMS, tag="rollouts"),
        Route("POST", "/api/v1/rollouts", Role.OPERATOR, "Create a staged rollout of uploaded packages (or a dry run).",
              create_rollout, body=CREATE_SCHEMA, responses={201: "Recorded; the controller drives it", 200: "Dry run: the plan",
                                                             400: "Bad body (names the field)"}, tag="rollouts"),
        Route("GET", "/api/v1/rollouts/{rollout_id}", Role.VIEWER,
              "Rollout status: per-wave progress, gate values against thresholds, per-device states.", show_rollout,
              responses={200: "OK", 404: "No such rollout"}, tag="rollouts"),
    ]
    for name, summary in ACTIONS.items():
        routes.append(Route("POST", f"/api/v1/rollouts/{{rollout_id}}/{name}", Role.OPERATOR, summary, action(name),
                            responses={202: "Requested; the controller applies it within a second", 404: "No such rollout",
                                       409: f"{name} does not apply in the rollout's status"}, tag="rollouts"))
    routes.append(Route("POST", "/api/v1/rollouts/{rollout_id}/approve", Role.OPERATOR,
                        "Approve a rollout awaiting approval (two-person rule: not its creator); it then starts at its "
                        "start time, or at once.", approve,
                        responses={200: "Approved: scheduled", 403: "Its creator may not approve it (two-person rule)",
                                   404: "No such rollout", 409: "It is not awaiting approval"}, tag="rollouts"))
    routes.append(Route("POST", "/api/v1/rollouts/{rollout_id}/reject", Role.OPERATOR,
                        "Reject a rollout awaiting approval, with a reason: it ends rejected, nothing sent.", reject,
                        body=REJECT_SCHEMA, responses={200: "Rejected", 400: "Bad body (names the field)",
                                                       404: "No such rollout", 409: "It is not awaiting approval"},
                        tag="rollouts"))
    return routes


def _decided(decide: Callable[[], RolloutRow]) -> RolloutRow:
    """Approve or reject: the creator approving is 403 (two-person rule), a rollout not awaiting approval 409."""
    try:
        return decide()
    except NotFoundError:
        raise
    except ApprovalRefused as exc:
        raise ApiError(403, str(exc)) from None
    except UserError as exc:
        raise ApiError(409, str(exc)) from None
