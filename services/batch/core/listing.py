"""OpenAI list pagination, pure: the query of a list call and the page it answers.

OpenAI's list calls (`GET /v1/files`, `GET /v1/batches`) take `limit`, `after` (the id of the last object of
the previous page) and, for files, `order` and `purpose`; they answer
`{"object": "list", "data", "first_id", "last_id", "has_more"}`. A `limit` that is not an integer in range,
an `order` other than asc/desc or an `after` that is not an id is a 400 naming the parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from services.batch.core.batch_api import BatchInputError, check_id

ORDERS = ("asc", "desc")


@dataclass(frozen=True)
class PageQuery:
    limit: int
    after: str | None = None
    order: str = "desc"
    """'desc': newest first (OpenAI's default)."""
    purpose: str | None = None


def parse_page_query(
    query: Mapping[str, str],
    *,
    default_limit: int,
    max_limit: int,
    orders: Sequence[str] = ("desc",),
    with_purpose: bool = False,
) -> PageQuery:
    """A list call's query string -> PageQuery; BatchInputError (400) naming the bad parameter."""
    raw_limit = query.get("limit")
    if raw_limit is None or raw_limit == "":
        limit = default_limit
    else:
        try:
            limit = int(raw_limit)
        except ValueError:
            raise BatchInputError(f"limit must be an integer between 1 and {max_limit}", param="limit") from None
        if not 1 <= limit <= max_limit:
            raise BatchInputError(f"limit must be between 1 and {max_limit} (got {limit})", param="limit")
    order = query.get("order") or orders[0]
    if order not in orders:
        raise BatchInputError(f"order must be one of {', '.join(orders)}", param="order")
    after = query.get("after") or None
    if after is not None:
        try:
            check_id(after, "after")
        except ValueError as exc:
            raise BatchInputError(str(exc), param="after") from None
    purpose = (query.get("purpose") or None) if with_purpose else None
    return PageQuery(limit=limit, after=after, order=order, purpose=purpose)


def page(items: Sequence[dict], limit: int) -> dict:
    """The list object of one page, from up to `limit + 1` items fetched in order (one more than the page
    says whether another page follows without a second query)."""
    data = list(items[:limit])
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(items) > limit,
    }
