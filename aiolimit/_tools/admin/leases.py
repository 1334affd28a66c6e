"""What ``aiolimit inspect`` shows of a concurrency limiter: its limit, its holders and their
expiries, its queue."""

from __future__ import annotations

from typing import Any

from ..._values import seconds as to_seconds
from ...backends._lease import LeaseSnapshot
from ..text import seconds

__all__ = ["leases_json", "render_leases"]


def render_leases(snapshot: LeaseSnapshot) -> list[str]:
    config = snapshot.config
    lines = [
        f"concurrency   at most {config.max_in_flight} in flight, "
        f"leases of {seconds(config.lease.total_seconds())}",
        f"in flight     {snapshot.in_flight} ({len(snapshot.holders)} holders shown)",
        f"waiting       {snapshot.waiting}",
    ]
    if snapshot.holders:
        lines.append(
            "holders       lease id                     permits  fence              ends in"
        )
        for holder in snapshot.holders:
            lines.append(
                f"              {holder.lease_id:<28} {holder.permits:>7}  {holder.fence:<18} "
                f"{seconds(to_seconds(holder.expires_in))}"
            )
    return lines


def leases_json(snapshot: LeaseSnapshot) -> dict[str, Any]:
    return {
        "max_in_flight": snapshot.config.max_in_flight,
        "lease_s": snapshot.config.lease.total_seconds(),
        "in_flight": snapshot.in_flight,
        "waiting": snapshot.waiting,
        "holders": [
            {
                "lease_id": h.lease_id,
                "permits": h.permits,
                "fence": h.fence,
                "expires_in_s": to_seconds(h.expires_in),
            }
            for h in snapshot.holders
        ],
    }
