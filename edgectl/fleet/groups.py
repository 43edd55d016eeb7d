"""Server-side device groups as the operator keeps them: create, list, show, change, delete, and ``group:NAME`` selectors.

Input is checked before anything is stored: a bad name, kind, query or description, or a static
member that is not a device of the controller store, is a :class:`GroupInputError` naming the field.
Every change is audited with its actor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from edgecore.errors import NotFoundError, UserError
from edgecore.windows import MAX_WINDOWS, Window, WindowError
from edgectl.controller.groups import (
    MAX_DESCRIPTION,
    MAX_MEMBERS,
    DeviceGroup,
    GroupConflict,
    GroupInputError,
    GroupKind,
    check_group_name,
    group_name,
    matching,
    resolve_group,
)
from edgectl.controller.records import ACTIVE, PENDING, DeviceRecord
from edgectl.controller.selector import FIELDS, parse_selector
from edgectl.controller.store import Store

__all__ = ["add_members", "create_group", "delete_group", "device_chooser", "group_detail", "group_list", "remove_members",
           "update_group"]

Chooser = Callable[[Sequence[DeviceRecord]], list[DeviceRecord]]


def device_chooser(store: Store | None, selector: str) -> Chooser:
    """What picks the devices ``selector`` names out of a list: ``k=v`` terms, or ``group:NAME`` (a group of ``store``).

    Checked now, before any device is read: a bad selector, or a group the store does not hold, is a UserError."""
    name = group_name(selector)
    if name is None:
        chosen = parse_selector(selector)
        return lambda records: matching(chosen, records)
    group = store.group(name) if store is not None else None
    if group is None:
        raise UserError(f"selector: no device group {name!r} (see `edgectl group list`)")
    return lambda records: resolve_group(group, records)


def create_group(store: Store, name: str, kind: str, members: Sequence[str] = (), query: str = "", description: str = "",
                 actor: str = "operator", protected: bool = False, windows: Sequence[str] = ()) -> DeviceGroup:
    """Check and keep a new group; GroupConflict when the name is taken. A rollout to a ``protected`` group waits
    for a second operator's approval; its devices install only inside its maintenance ``windows`` (edgecore.windows)."""
    now = store.now()
    group = _checked(store, DeviceGroup(check_group_name(name), _kind(kind), tuple(members), query.strip(), description,
                                        actor, now, now, protected, _windows(windows)))
    if not store.add_group(group):
        raise GroupConflict(f"a device group named {name!r} exists (see `edgectl group show {name}`)", "name")
    store.audit("group created", _said(group), actor=actor)
    return group


def update_group(store: Store, name: str, members: Sequence[str] | None = None, query: str | None = None,
                 description: str | None = None, actor: str = "operator", protected: bool | None = None,
                 windows: Sequence[str] | None = None) -> DeviceGroup:
    """Replace a group's members (static), query (dynamic), description, protected flag or maintenance windows (``[]``:
    none); what is None is kept. A running rollout keeps the windows it resolved when it was planned."""
    group = _group(store, name)
    changed = replace(group, members=group.members if members is None else tuple(members),
                      query=group.query if query is None else query.strip(),
                      description=group.description if description is None else description,
                      protected=group.protected if protected is None else protected,
                      windows=group.windows if windows is None else _windows(windows), updated_at=store.now())
    return _save(store, _checked(store, changed, group.members), actor)


def add_members(store: Store, name: str, device_ids: Sequence[str], actor: str = "operator") -> DeviceGroup:
    """Add devices to a static group (ones already in it are kept once)."""
    group = _static(store, name)
    _members(store, device_ids, set(group.members))  # a bad one is named by its place among those given
    return update_group(store, name, [*group.members, *(d for d in device_ids if d not in group.members)], actor=actor)


def remove_members(store: Store, name: str, device_ids: Sequence[str], actor: str = "operator") -> DeviceGroup:
    """Take devices out of a static group; a device that is not a member is a GroupInputError."""
    group = _static(store, name)
    for i, device_id in enumerate(device_ids):
        if device_id not in group.members:
            raise GroupInputError(f"members[{i}]", f"{device_id!r} is not a member of group {name!r}")
    return update_group(store, name, [m for m in group.members if m not in device_ids], actor=actor)


def delete_group(store: Store, name: str, actor: str = "operator") -> None:
    """Delete a group; GroupConflict while a rollout that is not finished was planned from it."""
    _group(store, name)
    using = [r.id for r in store.rollouts((*PENDING, *ACTIVE)) if group_name(r.spec.selector) == name]
    if using:
        raise GroupConflict(f"group {name!r} is the selector of {len(using)} rollout(s) still running "
                            f"({', '.join(using[:3])}): delete it when they end")
    store.remove_group(name)
    store.audit("group deleted", f"group {name}", actor=actor)


def group_list(store: Store) -> list[dict[str, Any]]:
    """Every group with how many devices it resolves to now (None: its query does not resolve, see ``group show``)."""
    devices = store.devices()
    rows = []
    for group in store.groups():
        resolved, _ = _resolved(group, devices)
        rows.append(group.to_dict() | {"resolved": None if resolved is None else len(resolved)})
    return rows


def group_detail(store: Store, name: str) -> dict[str, Any]:
    """One group and the devices it resolves to now; ``missing``: static members the store no longer holds;
    ``problem``: why a dynamic group's query does not resolve now (its ``devices`` are then None)."""
    group = _group(store, name)
    devices, problem = _resolved(group, store.devices())
    found = {d.id for d in devices or ()}
    return group.to_dict() | {"devices": None if devices is None else [d.to_dict() for d in devices],
                              "missing": [m for m in group.members if m not in found], "problem": problem}


def _resolved(group: DeviceGroup, devices: Sequence[DeviceRecord]) -> tuple[list[DeviceRecord] | None, str]:
    try:
        return resolve_group(group, devices), ""
    except UserError as exc:  # its query names a tag no device reports now; a rollout to it is refused the same way
        return None, str(exc)


def _group(store: Store, name: str) -> DeviceGroup:
    group = store.group(name)
    if group is None:
        raise NotFoundError(f"no device group {name!r} (see `edgectl group list`)")
    return group


def _static(store: Store, name: str) -> DeviceGroup:
    group = _group(store, name)
    if group.kind != GroupKind.STATIC:
        raise GroupInputError("members", f"group {name!r} is dynamic: change its query instead")
    return group


def _kind(kind: str) -> GroupKind:
    try:
        return GroupKind(kind)
    except ValueError:
        raise GroupInputError("kind", f"{kind[:40]!r} is not static or dynamic") from None


def _checked(store: Store, group: DeviceGroup, kept: Sequence[str] = ()) -> DeviceGroup:
    """The group with its members kept once, or GroupInputError naming what is wrong. A member must be a device
    of the store, unless it is ``kept`` from before (a device that left the store stays listed until removed)."""
    if len(group.description) > MAX_DESCRIPTION:
        raise GroupInputError("description", f"at most {MAX_DESCRIPTION} characters")
    if group.kind == GroupKind.STATIC:
        if group.query:
            raise GroupInputError("query", "a static group lists members; only a dynamic group has a query")
        return replace(group, members=_members(store, group.members, set(kept)))
    if group.members:
        raise GroupInputError("members", "a dynamic group has a query; only a static group lists members")
    _check_query(store, group.query)
    return group


def _windows(windows: Sequence[str]) -> tuple[str, ...]:
    """The windows as their canonical texts; GroupInputError naming ``windows[i]`` for one that does not parse."""
    if len(windows) > MAX_WINDOWS:
        raise GroupInputError("windows", f"{len(windows)} windows; at most {MAX_WINDOWS}")
    texts = []
    for i, text in enumerate(windows):
        try:
            texts.append(str(Window.parse(text)))
        except WindowError as exc:
            raise GroupInputError(f"windows[{i}]", str(exc)) from None
    return tuple(texts)


def _members(store: Store, members: Sequence[str], kept: set[str]) -> tuple[str, ...]:
    if len(members) > MAX_MEMBERS:
        raise GroupInputError("members", f"at most {MAX_MEMBERS} devices")
    known = kept | {d.id for d in store.devices()}
    for i, device_id in enumerate(members):
        if device_id not in known:
            raise GroupInputError(f"members[{i}]",
                                  f"no device {device_id[:80]!r} in the controller store (see `edgectl devices`)")
    return tuple(dict.fromkeys(members))


def _check_query(store: Store, query: str) -> None:
    if not query:
        raise GroupInputError("query", "a dynamic group needs a selector, e.g. target=jetson-orin,site=lobby")
    try:
        chosen = parse_selector(query)
    except UserError as exc:
        raise GroupInputError("query", str(exc).removeprefix("selector: ")) from None
    tags = store.device_tag_keys()
    unknown = [k for k, _ in chosen.terms if k not in FIELDS and k not in tags]
    if unknown:
        raise GroupInputError("query", f"unknown key {unknown[0]!r} (known: {', '.join([*FIELDS, *sorted(tags)])})")


def _save(store: Store, group: DeviceGroup, actor: str) -> DeviceGroup:
    if not store.save_group(group):
        raise NotFoundError(f"no device group {group.name!r} (see `edgectl group list`)")
    store.audit("group changed", _said(group), actor=actor)
    return group


def _said(group: DeviceGroup) -> str:
    what = f"{len(group.members)} member(s)" if group.kind == GroupKind.STATIC else f"query {group.query}"
    windows = f", windows {'; '.join(group.windows)}" if group.windows else ""
    return f"group {group.name} ({group.kind}{', protected' if group.protected else ''}{windows}): {what}"
