"""``/api/v1/groups``: server-side device groups (static member lists, dynamic stored queries) that rollouts target."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from edgecore.windows import MAX_WINDOWS
from edgectl.api.context import ApiContext
from edgectl.api.router import ApiError, Request, Response, Route
from edgectl.controller.accounts import Role
from edgectl.controller.groups import MAX_DESCRIPTION, GroupConflict, GroupInputError, GroupKind
from edgectl.fleet import create_group, delete_group, group_detail, group_list, update_group

__all__ = ["CREATE_SCHEMA", "UPDATE_SCHEMA", "group_routes"]

MEMBERS = {"type": "array", "items": {"type": "string", "minLength": 1},
           "description": "Static group: device ids of the controller store (an unknown id is refused)."}
QUERY = {"type": "string", "description": "Dynamic group: a selector k=v[,k=v] over id, target, model, version, status, "
                                          "agent, site or tag keys, evaluated when the group is used."}
DESCRIPTION = {"type": "string", "description": f"Free text, at most {MAX_DESCRIPTION} characters."}
PROTECTED = {"type": "boolean", "description": "A rollout to this group waits for a second operator's approval "
                                               "(POST /api/v1/rollouts/{rollout_id}/approve)."}
WINDOWS = {"type": "array", "maxItems": MAX_WINDOWS, "items": {"type": "string", "minLength": 1},
           "description": "Maintenance windows in each device's local time, e.g. ['Mon-Fri 02:00-04:00', 'Sat,Sun 00:00-24:00'] "
                          "(an end before the start crosses midnight): the group's devices install only inside one; "
                          "[] removes them. A device in several groups with windows installs when all allow it."}
CREATE_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["name", "kind"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "description": "1-63 lower-case letters, digits, '.', '_', '-'; "
                                                                  "rollouts name it as group:NAME."},
        "kind": {"type": "string", "enum": [k.value for k in GroupKind]},
        "members": MEMBERS, "query": QUERY, "description": DESCRIPTION, "protected": PROTECTED, "windows": WINDOWS,
    },
}
UPDATE_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "properties": {"members": {**MEMBERS, "description": "Static group: the new member list (replaces the old)."},
                   "query": QUERY, "description": DESCRIPTION, "protected": PROTECTED, "windows": WINDOWS},
}
T = TypeVar("T")


def _answer(change: Callable[[], T]) -> T:
    """Run a change; a bad field is a 400 naming it, a conflict a 409."""
    try:
        return change()
    except GroupInputError as exc:
        raise ApiError(400, str(exc), exc.field) from None
    except GroupConflict as exc:
        raise ApiError(409, str(exc), exc.field) from None


def group_routes(ctx: ApiContext) -> list[Route]:
    def list_groups(_request: Request) -> Response:
        with ctx.timer.time("groups"):
            return Response(200, {"groups": group_list(ctx.store)})

    def create(request: Request) -> Response:
        body: dict[str, Any] = request.values["body"]
        group = _answer(lambda: create_group(ctx.store, body["name"], body["kind"], body.get("members", ()),
                                             body.get("query", ""), body.get("description", ""), request.actor,
                                             body.get("protected", False), body.get("windows", ())))
        return Response(201, group.to_dict())

    def show(request: Request) -> Response:
        with ctx.timer.time("group_detail"):
            return Response(200, group_detail(ctx.store, request.path_params["name"]))

    def update(request: Request) -> Response:
        body: dict[str, Any] = request.values["body"]
        if not body:
            raise ApiError(400, "body: give members, query, description, protected or windows", "body")
        group = _answer(lambda: update_group(ctx.store, request.path_params["name"], body.get("members"), body.get("query"),
                                             body.get("description"), request.actor, body.get("protected"),
                                             body.get("windows")))
        return Response(200, group.to_dict())

    def delete(request: Request) -> Response:
        name = request.path_params["name"]
        _answer(lambda: delete_group(ctx.store, name, request.actor))
        return Response(200, {"deleted": name})

    return [
        Route("GET", "/api/v1/groups", Role.VIEWER, "List device groups with how many devices each resolves to now.",
              list_groups, tag="groups"),
        Route("POST", "/api/v1/groups", Role.OPERATOR, "Create a static (members) or dynamic (query) device group.", create,
              body=CREATE_SCHEMA, responses={201: "Created", 400: "Bad body (names the field); nothing stored",
                                             409: "A group of that name exists"}, tag="groups"),
        Route("GET", "/api/v1/groups/{name}", Role.VIEWER, "One group and the devices it resolves to now.", show,
              responses={200: "OK", 404: "No such group"}, tag="groups"),
        Route("PATCH", "/api/v1/groups/{name}", Role.OPERATOR, "Replace a group's members (static), query (dynamic), "
              "description, protected flag or maintenance windows; a running rollout keeps the devices and windows it resolved.",
              update, body=UPDATE_SCHEMA,
              responses={200: "Changed", 400: "Bad body (names the field); nothing stored", 404: "No such group"},
              tag="groups"),
        Route("DELETE", "/api/v1/groups/{name}", Role.OPERATOR, "Delete a group no running rollout was planned from.", delete,
              responses={200: "Deleted", 404: "No such group", 409: "A running rollout uses it"}, tag="groups"),
    ]
