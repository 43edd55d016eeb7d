"""How commands print: rich tables for people, JSON for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["console", "print_json", "print_table"]

console = Console(stderr=False, highlight=False)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    table = Table(title=title, title_justify="left", header_style="bold")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    console.print(table)
