"""What one turn is, whatever API it came in on: the API it uses (`Api`), what the edge parsed from the
request (`TurnSpec`) and the token counts the worker reported (`Usage`).

The HTTP and gRPC APIs build a `TurnSpec`; `turns.TurnRunner` runs it.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field

from services.router.turn.session import SessionIdentity


class Api(enum.Enum):
    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    GENERATE = "/generate"


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass
class TurnSpec:
    api: Api
    body: dict  # forwarded to the worker; `priority`/`stream_options` are set here
    identity: SessionIdentity
    model: str | None
    stream: bool
    prompt_text: str = ""  # rendered prompt, when the request is text
    prompt_token_ids: list[int] | None = None  # given by the client, or from the model tokenizer
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    client: str = ""  # who sent it (edge.client_identity), for the per-client limits
    traffic: str = "online"  # "batch" when marked X-Bandmaster-Traffic: batch (session.traffic)


def request_attributes(spec: TurnSpec) -> dict[str, str]:
    """The `router.request` span's names of the turn: its request id and, for a program, its session id, by
    which `bandmaster trace --request-id / --session-id` finds the turn in span files. Span attributes,
    never metric labels: the values are unbounded."""
    attributes = {"router.request_id": spec.request_id}
    if spec.identity.session_id:
        attributes["router.session_id"] = spec.identity.session_id
    return attributes
