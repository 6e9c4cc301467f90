"""The harvested worker's drafter window cycle and role pieces: one implementation for every worker.

Who calls it: the harvested role (``spot/harvested.py``) of the rollout worker
(``rollout/control.py``, its HTTP surface ``rollout/http.py``) and of the trainer's own drafter
training (``trainer/drafter_window.py``, its HTTP surface ``trainer/service.py``) and, through
:class:`~longtail_workers.spot.sequences.SequenceWindows`, the dedicated drafter worker
(``drafter_worker/worker.py``). One window of :class:`WindowCycle`:

1. sync: train on top of the newest published drafter version (:func:`newest_drafter` is the
   one place that fetches it; a rollout worker's engine loads its drafter there too);
2. start: the spot trainer (``spot/trainer.py``) trains in the background from its buffer. How
   the buffer gets filled is the part that differs, so it is the caller's strategy: a rollout
   worker's generate calls capture into it; the trainer and the drafter worker recompute the
   hidden states of given answers (``spot/sequences.py``);
3. stop: the caller's (a role switch, the end of a rollout, a time budget);
4. judge on held-out windows, then revert to the base or submit the candidate
   (:meth:`WindowCycle.submit`, by the one owner of the window: ``spot/harvested.py`` for a
   harvested worker, the drafter worker's loop; a candidate the trainer refuses as stale, its
   base no longer the latest version, is logged and dropped, never retried).

The role state machine's shared pieces live here too, so no program imports another:
:class:`RoleConflictError` (HTTP 409), :class:`InvalidRoleError` (400), :func:`check_activity`,
and ``PUT /v1/role``'s body and answers (:func:`role_from_body`, :func:`answer_put_role`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import get_args

from torch import nn

from longtail_api.harvest import Activity
from longtail_api.wirecodec import to_wire
from longtail_api.workerapi import RoleAck, RoleAnswer
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.registry import (
    Candidate,
    CandidateInfo,
    DrafterStore,
    StaleCandidateError,
)
from longtail_workers.httprequest import BodyErrors, JSONRequestHandler, fail
from longtail_workers.spot.trainer import SpotTrainer

log = logging.getLogger(__name__)

_SEND_LENGTH = "send the body with a Content-Length header"
ROLE_BODY_ERRORS = BodyErrors(
    chunked=_SEND_LENGTH,
    missing=_SEND_LENGTH,
    invalid="Content-Length: must be an integer, got {raw!r}",
    too_large="body is {length} bytes, over {limit}",
    blank_is_missing=True,
)
_EXAMPLE = '{"role": "drafter-train"}'


class RoleConflictError(RuntimeError):
    """A well-formed request the worker cannot honour now (HTTP 409)."""


class InvalidRoleError(ValueError):
    """Not an activity name at all (HTTP 400)."""


def check_activity(role: object, allowed: tuple[Activity, ...], who: str) -> Activity:
    """``role`` as one of ``allowed``: :class:`InvalidRoleError` (HTTP 400) for a value that is
    no activity at all, :class:`RoleConflictError` (409) for one ``who`` cannot take."""
    if not isinstance(role, str) or role not in get_args(Activity):
        raise InvalidRoleError(f"role: unknown activity {role!r}; use one of {', '.join(allowed)}")
    if role not in allowed:
        raise RoleConflictError(
            f"role: {who} cannot take {role!r}; it can do {' or '.join(allowed)}"
        )
    return role


def role_from_body(body: bytes) -> object:
    """The ``role`` of a ``PUT /v1/role`` body (unchecked value); 400 for anything else."""
    if not body.strip():
        fail(HTTPStatus.BAD_REQUEST, f"request body is empty; send {_EXAMPLE}")
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        fail(HTTPStatus.BAD_REQUEST, f"malformed JSON ({exc}); send {_EXAMPLE}")
    if not isinstance(data, dict):
        fail(HTTPStatus.BAD_REQUEST, f"body must be a JSON object like {_EXAMPLE}")
    unknown = sorted(set(data) - {"role"})
    if unknown:
        fail(HTTPStatus.BAD_REQUEST, f"{unknown[0]}: is not a known field (send {_EXAMPLE})")
    if "role" not in data:
        fail(HTTPStatus.BAD_REQUEST, f"role: is required (send {_EXAMPLE})")
    return data["role"]


def answer_put_role(
    handler: JSONRequestHandler,
    worker: str,
    set_role: Callable[[object], RoleAck],
    max_body_bytes: int,
) -> int:
    """``PUT /v1/role`` for ``worker``: 200 with the acknowledged role, 202 while the switch
    completes, 409 when ``set_role`` refuses it now, 400 for a malformed body or role."""
    role = role_from_body(handler.read_body(max_body_bytes, ROLE_BODY_ERRORS))
    try:
        ack = set_role(role)
    except InvalidRoleError as exc:
        fail(HTTPStatus.BAD_REQUEST, str(exc))
    except RoleConflictError as exc:
        fail(HTTPStatus.CONFLICT, f"role {role!r} refused: {exc}")
    code = HTTPStatus.ACCEPTED if ack.pending else HTTPStatus.OK
    return handler.send_json(code, to_wire(RoleAnswer(worker, ack)))


def newest_drafter(
    registry: DrafterStore, model: nn.Module, target_id: str, have: int | None
) -> tuple[EagleDrafter, int] | None:
    """The newest published drafter on ``model`` and its version; None when ``have`` is it or
    none is published. Raises what the registry raises (``DrafterExchangeError`` for the
    trainer's HTTP exchange): the caller decides whether to go on with what it has."""
    latest = registry.latest_version()
    if latest is None or latest == have:
        return None
    drafter, published = registry.load(model, target_id=target_id, version=latest)
    return drafter, published.version


class WindowCycle:
    """Sync -> start -> (caller stops) -> judge -> revert or submit (see the module text).

    ``spot`` trains from a buffer the caller fills; ``registry`` None: nothing is synced or
    submitted (a worker without a drafter registry trains for itself)."""

    def __init__(
        self,
        spot: SpotTrainer,
        registry: DrafterStore | None,
        model: nn.Module,
        *,
        target_id: str,
    ) -> None:
        self.spot, self.registry, self.model, self.target_id = spot, registry, model, target_id
        self._submitted_at: int | None = None  # spot.total_steps of the last window sent
        self.last_candidate: Candidate | None = None
        """The newest candidate submitted."""
        self.stale_refused = 0
        """Candidates the registry refused because their base was no longer (or not yet) the
        latest version (``StaleCandidateError``, HTTP 409): dropped, not retried."""

    def sync_base(self) -> int | None:
        """Train on top of the newest published version (keeps the optimizer's moments); returns
        the base version. Raises as :func:`newest_drafter` does."""
        if self.registry is None:
            return self.spot.base_version
        found = newest_drafter(self.registry, self.model, self.target_id, self.spot.base_version)
        if found is not None:
            drafter, version = found
            self.spot.load_weights(drafter.trainable_state_dict(), base_version=version)
        return self.spot.base_version

    def submit(self, worker: str, policy_version: int, who: str) -> Candidate | None:
        """Gate the drafter trained since the last submission and submit it as ``worker``'s
        candidate (the spot trainer must be stopped). ``policy_version``: the version to tag it
        with when the buffer names none; ``who``: the log lines' prefix. None: no registry,
        nothing new was trained, or the gate dropped the window (the weights go back to the
        base)."""
        spot = self.spot
        if self.registry is None:
            return None
        if spot.pairs_since_base == 0 or spot.total_steps == self._submitted_at:
            return None  # already sent, or nothing trained since the base
        verdict = spot.judge_against_base()
        if not verdict.keep:
            spot.revert_to_base()
            log.info("%s: drafter window dropped, held-out top-1 %.3f < %.3f of base "
                     "version %s", who, verdict.trained_top1, verdict.base_top1,
                     spot.base_version)  # fmt: skip
            return None
        window = spot.last_window
        info = CandidateInfo(
            worker=worker,
            base_version=spot.base_version,
            policy_version=max(spot.policy_versions_seen, default=policy_version),
            tokens=spot.pairs_since_base,
            steps=spot.total_steps,
            train_loss=window.mean_loss if window is not None else None,
            heldout_top1=verdict.trained_top1,
        )
        try:
            cand = self.registry.submit_candidate(spot.drafter_copy(), info)
        except StaleCandidateError as exc:
            # Never merged, so never retried: the next window syncs to the latest version.
            self._submitted_at = spot.total_steps
            self.stale_refused += 1
            log.warning("%s: drafter candidate dropped: %s", who, exc)
            return None
        self._submitted_at, self.last_candidate = spot.total_steps, cand
        log.info("%s: drafter candidate submitted (base %s, %d pairs, %d steps)",
                 who, cand.base_version, cand.tokens, cand.steps)  # fmt: skip
        return cand
