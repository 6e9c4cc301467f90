"""JSON form of the trainer's ``GET /v1/samples/latest``: the answers a drafter worker trains on.

The trainer's HTTP surface (``trainer/service.py``) answers with :class:`StepSamples`, built by
the step driver (``trainer/driver.py``) once a step's policy update, policy publish and drafter
merge are done; the dedicated drafter worker (``drafter_worker/worker.py``) reads it with
:class:`SampleFeed`. Both sides use these types, so a field is spelled once; keys are
camelCase like the other worker APIs::

    GET /v1/samples/latest[?after=N]
      -> 200 {"step": S, "policyVersion": P, "sequences": [{"id", "promptTokenIds",
              "outputTokenIds"}, ...]}

``step`` is the newest completed RL step (0: none yet, no sequences), ``policyVersion`` the
policy version published after it: the one whose hidden states the drafter trains on, and the
one the rollout workers sample the next step with. With ``after=N`` and ``S <= N`` the answer
carries no sequences (nothing new: polling is cheap). A read, so no token is needed, like the
drafter and weight downloads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import parse_qs

from longtail_api.fields import Constraints
from longtail_api.protocol import ProtocolError
from longtail_api.wirecodec import WIRE_NAME, Count, from_wire
from longtail_workers.httpclient import checked_base_url, http_json

log = logging.getLogger(__name__)

SAMPLES_PATH = "/v1/samples/latest"


@dataclass(frozen=True)
class StepSequence:
    """One answer of a step: what a drafter window needs (no logprobs, no hidden states)."""

    request_id: str | None = field(metadata={WIRE_NAME: "id"})
    """The generate request's id (``s{step}-p{prompt}-g{answer}``)."""
    prompt_token_ids: Annotated[tuple[int, ...], Constraints(min_items=1)]
    """Prompt token ids (at least one)."""
    output_token_ids: tuple[int, ...]
    """Generated token ids."""


@dataclass(frozen=True)
class StepSamples:
    """Body of ``GET /v1/samples/latest`` (see the module text); JSON by ``wirecodec``."""

    step: Count
    """The newest completed RL step; 0 before the first one."""
    policy_version: Count
    """The policy version published after ``step`` (hidden states are recomputed with it)."""
    sequences: tuple[StepSequence, ...] = ()
    """The step's answers; empty before the first step and in a "nothing after N" answer."""

    @classmethod
    def of(cls, step: int, policy_version: int, samples: Sequence[Any]) -> StepSamples:
        """From the driver's ``rollout.wire.Sample`` list (anything with the token fields)."""
        return cls(step, policy_version, tuple(
            StepSequence(s.request_id, tuple(s.prompt_token_ids), tuple(s.output_token_ids))
            for s in samples
        ))  # fmt: skip

    def after(self, step: int | None) -> StepSamples:
        """This answer for a client that has seen ``step`` already (no sequences if not newer)."""
        if step is None or self.step > step:
            return self
        return StepSamples(self.step, self.policy_version)


def parse_after(query: str) -> int | None:
    """The ``after`` of ``GET /v1/samples/latest?after=N``; ``ProtocolError`` unless an int >= 0."""
    values = parse_qs(query, keep_blank_values=True).get("after")
    if not values:
        return None
    raw = values[-1]
    if not raw.isdigit():
        raise ProtocolError(f"query after={raw!r}", "must be a step number >= 0")
    return int(raw)


class SampleFeed:
    """The drafter worker's client of ``GET /v1/samples/latest`` on the trainer at ``base_url``."""

    def __init__(
        self,
        base_url: str,
        *,
        request_timeout_s: float = 30.0,
        poll_s: float = 0.5,
        max_backoff_s: float = 10.0,
    ) -> None:
        if request_timeout_s <= 0 or poll_s <= 0 or max_backoff_s < poll_s:
            raise ValueError(
                f"need request_timeout_s > 0, poll_s > 0, max_backoff_s >= poll_s; got "
                f"{request_timeout_s}, {poll_s}, {max_backoff_s}"
            )
        self.url = checked_base_url(base_url, "trainer URL") + SAMPLES_PATH
        self.request_timeout_s, self.poll_s, self.max_backoff_s = (
            request_timeout_s, poll_s, max_backoff_s
        )  # fmt: skip
        self.last_error: str | None = None
        """The last failed poll's error (None once a poll succeeds)."""

    def latest(self, after: int | None = None) -> StepSamples:
        """One poll; ``OSError`` (unreachable, HTTP error) or ``ProtocolError`` (bad answer)."""
        url = self.url if after is None else f"{self.url}?after={after}"
        return from_wire(StepSamples, http_json(url, None, self.request_timeout_s, "GET"), "body")

    def wait_newer(self, after: int, timeout_s: float, stop: threading.Event) -> StepSamples | None:
        """The first answer with a step > ``after`` and its answers; None on ``stop`` or when
        ``timeout_s`` passes with the trainer answering (no new step yet). Failed polls are retried
        with backoff; ``TimeoutError`` naming the URL and the last error when none
        succeeded before the deadline."""
        deadline = time.monotonic() + timeout_s
        delay, answered = self.poll_s, False
        while not stop.is_set():
            try:
                got = self.latest(after)
                answered, self.last_error, delay = True, None, self.poll_s
                if got.step > after and got.sequences:  # a resumed trainer: none until a step
                    return got
            except (OSError, ValueError) as exc:
                if self.last_error != str(exc):  # once per distinct problem, not every poll
                    log.warning("GET %s failed: %s; retrying with backoff", self.url, exc)
                self.last_error = str(exc)
                delay = min(self.max_backoff_s, delay * 2)
            left = deadline - time.monotonic()
            if left <= 0:
                if answered:
                    return None
                raise TimeoutError(
                    f"GET {self.url}: no answer in {timeout_s:g}s (last error: "
                    f"{self.last_error}); is the trainer running at that URL "
                    "(--trainer-url / LONGTAIL_TRAINER_URL)?"
                )
            stop.wait(min(delay, left))
        return None
