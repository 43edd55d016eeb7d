"""``edgectl device logs ID``: a device's recent log lines, asked through the controller store (docs/fleet.md, Remote logs).

The running controller's engine leader sends the signed request; the device's answer comes back
through the store, so this works from any workstation that reaches the store.
"""

from __future__ import annotations

import datetime as dt

import typer

from edgecore.errors import UserError
from edgecore.protocol.logs import LEVELS, MAX_LINES, LogQuery
from edgectl.cli.access import _actor
from edgectl.cli.app import options
from edgectl.cli.output import console, print_json
from edgectl.cli.security import device_app
from edgectl.config import load_edgectl_config
from edgectl.controller.logs import DEFAULT_WAIT_S, MAX_WAIT_S, LogRequest, ask_logs, new_request_id
from edgectl.fleet import open_store
from edgectl.fleet.audit import parse_time

__all__ = ["device_logs"]


@device_app.command("logs")
def device_logs(
    ctx: typer.Context,
    device_id: str = typer.Argument(..., metavar="ID", help="Device id (see `edgectl devices`)."),
    lines: int | None = typer.Option(None, "--lines", "-n", min=1, max=MAX_LINES,
                                     help=f"The newest lines (default 100; {MAX_LINES} with --since or --until)."),
    since: str | None = typer.Option(None, "--since", help="Only records at or after this time (Unix seconds or ISO 8601)."),
    until: str | None = typer.Option(None, "--until", help="Only records at or before this time."),
    level: str = typer.Option("DEBUG", "--level", "-l", help=f"Only records at this level or above ({', '.join(LEVELS)})."),
    wait: float = typer.Option(DEFAULT_WAIT_S, "--wait", min=1, max=MAX_WAIT_S, help="Seconds to wait for the answer."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Ask a device for its recent log lines (redacted of secrets, at most 64 KiB) and print them."""
    if level.upper() not in LEVELS:
        raise UserError(f"--level: {level[:16]!r} is not one of {', '.join(LEVELS)}")
    start = None if since is None else parse_time(since, "--since")
    end = None if until is None else parse_time(until, "--until")
    if start is not None and end is not None and start > end:
        raise UserError("--since: later than --until")
    store = open_store(load_edgectl_config(options(ctx).config))
    answered = ask_logs(store, device_id, LogQuery.asked(new_request_id(), lines, start, end, level.upper()), _actor(),
                        wait)
    if as_json:
        print_json(answered.to_dict())
    else:
        _print(answered)


def _print(answered: LogRequest) -> None:
    answer = answered.answer
    assert answer is not None  # ask_logs returns answered requests only
    for line in answer.lines:
        console.print(f"{_when(line.ts)} {line.level:<8} {line.logger}: {line.message}", markup=False, highlight=False,
                      soft_wrap=True)
    held = "nothing" if answer.held_since is None else f"records since {_when(answer.held_since)}"
    more = "; older matching lines left out (64 KiB cap): narrow with --since/--lines" if answer.truncated else ""
    console.print(f"{len(answer.lines)} line(s) from {answered.device_id}; it holds {held}{more}", markup=False,
                  highlight=False)


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
