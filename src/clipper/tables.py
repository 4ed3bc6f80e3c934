"""Plain-text tables for the client commands (``clipper models``, ``clipper status`` ...): the
row formatting that :mod:`clipper.commands` and :mod:`clipper.cli_ops` share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["autoscale_rows", "table"]


def table(rows: Sequence[dict[str, Any]], cols: list[str]) -> str:
    """``rows`` as aligned text columns ``cols`` (upper-case headers; None and [] are "-")."""

    def cell(v: Any) -> str:
        if isinstance(v, list):
            return ",".join(map(str, v)) or "-"
        return "-" if v is None else str(v)

    cells = [[cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def autoscale_rows(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per autoscaled version: its bounds, and what the frontend driving it sees."""
    rows = []
    for m in models:
        a = m.get("autoscale")
        if not a:
            continue
        st = a.get("status") or {}
        last = st.get("last_decision") or {}
        util = st.get("utilization")
        rows.append(
            {
                "model_name": m["model_name"],
                "model_version": m["model_version"],
                "on": a["enabled"],
                "replicas": a["num_replicas"],
                "bounds": f"{a['min_replicas']}..{a['max_replicas']}",
                "target": a["target_utilization"],
                "utilization": None if util is None else round(util, 2),
                "last_decision": last.get("reason"),
                "note": _note(a, st),
            }
        )
    return rows


def _note(a: dict[str, Any], st: dict[str, Any]) -> object:
    """The autoscaling table's note: the decision state, led by ``scaled to zero`` (or
    ``waking from zero``) when the version has no replica for that reason."""
    note = st.get("note") if a["driven_here"] else "driven by another frontend"
    state = a.get("state", "running")
    return note if state == "running" else f"{state}: {note}"
