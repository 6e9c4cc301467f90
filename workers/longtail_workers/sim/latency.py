"""Seconds of one engine call at any (batch, context), read off an :class:`EngineProfile`.

The step simulator (``sim/step.py``) asks :class:`LatencyModel` for the cost of every decode
step, verify pass, draft step and prefill it simulates. A profile holds timed points only at
the batch sizes, contexts and token counts it was taken at; in between they are interpolated:

* **tokens** (new positions per sequence; 1 for decode and draft, k+1 for a verify of depth k):
  the points of the profiled token count are used when it was profiled; otherwise the two
  profiled counts on either side are each interpolated and the result is linear between them.
* **context**: at each profiled context the batch curve is evaluated, then the result is
  piecewise linear between the two profiled contexts on either side.
* **batch**: piecewise linear between the two profiled batch sizes on either side.

Every axis is **clamped**: outside the profiled range the nearest end's value is used (no
extrapolation), so a query beyond the profile never invents a slope the profile did not show.
A profile that should cover long answers must therefore be taken at long contexts.

A speculative step costs what its drafter kind runs (:meth:`LatencyModel.speculative_step_s`):
``learned`` the whole speculative step; ``history`` the history-only step (the verify of staged
drafts, no drafter forward: the profile's ``history_speculative`` curve, or the speculative step
less its k draft steps and at least a plain step, for a profile without it) plus every row's
host proposal (the profile's ``history_propose``, or :data:`DEFAULT_PROPOSE_S`); ``hybrid`` the
whole speculative step plus the proposals. The drafter's catch-up is the worker's to charge
(``sim/worker.py``): a history step feeds the learned drafter nothing.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

from longtail_api.policies import DrafterKind
from longtail_api.profile import EngineProfile, ProfileError, StepPoint

DEFAULT_PROPOSE_S = 1e-5
"""Host seconds of one row's history proposal where the profile has none: rounded up from what
``profile/history_costs.py`` measures on the development VM's CPU over the contexts and depths
of the full profile (docs/simulator.md)."""


def interp1(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear ``y(x)`` through sorted, distinct ``xs``; clamped at both ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _along(keys: Sequence[int], x: float, value_at: Callable[[int], float]) -> float:
    """Interpolate (clamped) between the values at the keys on either side of ``x``."""
    if x <= keys[0]:
        return value_at(keys[0])
    if x >= keys[-1]:
        return value_at(keys[-1])
    i = bisect.bisect_right(keys, x)
    lo, hi = keys[i - 1], keys[i]
    return interp1([lo, hi], [value_at(lo), value_at(hi)], x)


class Curve:
    """One profile curve (decode, verify or draft) indexed for fast lookups: token count ->
    context -> sorted batch sizes and their seconds (duplicate points are averaged)."""

    def __init__(self, points: Sequence[StepPoint], name: str = "curve") -> None:
        if not points:
            raise ProfileError(f"{name}: no points to interpolate; profile at least one batch size")
        grouped: dict[int, dict[int, dict[int, list[float]]]] = {}
        for p in points:
            by_b = grouped.setdefault(p.tokens, {}).setdefault(p.context, {})
            by_b.setdefault(p.batch, []).append(p.seconds)
        self._table = {
            t: {
                c: ([float(b) for b in sorted(by_b)], [_mean(by_b[b]) for b in sorted(by_b)])
                for c, by_b in by_c.items()
            }
            for t, by_c in grouped.items()
        }
        self._tokens = sorted(self._table)
        self._contexts = {t: sorted(by_c) for t, by_c in self._table.items()}

    def seconds(self, batch: float, context: float, tokens: float) -> float:
        """Seconds of one forward of ``batch`` sequences at ``context`` with ``tokens`` new
        positions each (see the module text for the scheme)."""

        def at_tokens(t: int) -> float:
            by_c = self._table[t]
            return _along(self._contexts[t], context, lambda c: interp1(*by_c[c], batch))

        return _along(self._tokens, tokens, at_tokens)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def interpolate(points: Sequence[StepPoint], batch: float, context: float, tokens: float) -> float:
    """Seconds of one forward from ``points`` (one-off lookup; :class:`Curve` indexes once)."""
    return Curve(points).seconds(batch, context, tokens)


class LatencyModel:
    """The cost of each engine call of one rollout worker, from one profile."""

    def __init__(self, profile: EngineProfile) -> None:
        self.profile = profile
        self._decode = Curve(profile.decode, "decode")
        self._verify = Curve(profile.verify, "verify")
        self._draft = Curve(profile.draft, "draft")
        self._speculative = Curve(profile.speculative) if profile.speculative else None
        self._history = Curve(profile.history_speculative) if profile.history_speculative else None
        self._propose = Curve(profile.history_propose) if profile.history_propose else None

    def decode_s(self, batch: int, context: float) -> float:
        """One plain decode step (1 new token per sequence) of the target."""
        return self._decode.seconds(batch, context, 1)

    def verify_s(self, batch: int, context: float, depth: int) -> float:
        """One verify pass of ``depth`` draft tokens (``depth + 1`` positions per sequence)."""
        return self._verify.seconds(batch, context, depth + 1)

    def draft_s(self, batch: int, context: float) -> float:
        """One draft step (1 token per sequence) of the drafter."""
        return self._draft.seconds(batch, context, 1)

    def speculative_s(self, batch: int, context: float, depth: int) -> float:
        """One speculative step of depth ``depth``: the engine-measured whole step where the
        profile has them, else ``depth`` draft steps plus one verify (a roofline profile)."""
        if self._speculative is not None:
            return self._speculative.seconds(batch, context, depth + 1)
        return depth * self.draft_s(batch, context) + self.verify_s(batch, context, depth)

    def history_step_s(self, batch: int, context: float, depth: int) -> float:
        """One history-only speculative step of depth ``depth`` without the host's proposals:
        the profile's measured step, else the speculative step less its ``depth`` draft steps
        (at least a plain decode step)."""
        if self._history is not None:
            return self._history.seconds(batch, context, depth + 1)
        spec = self.speculative_s(batch, context, depth)
        return max(self.decode_s(batch, context), spec - depth * self.draft_s(batch, context))

    def propose_s(self, context: float, depth: int) -> float:
        """Host seconds of one row's history proposal of ``depth`` tokens at ``context``."""
        if self._propose is None:
            return DEFAULT_PROPOSE_S
        return self._propose.seconds(1, context, depth)

    def speculative_step_s(
        self, kind: DrafterKind, batch: int, context: float, depth: int
    ) -> float:
        """One speculative step of depth ``depth`` drafted by ``kind`` (the module text), the
        learned drafter's catch-up not included."""
        if kind == "learned":
            return self.speculative_s(batch, context, depth)
        proposals = batch * self.propose_s(context, depth)
        if kind == "hybrid":
            return self.speculative_s(batch, context, depth) + proposals
        return self.history_step_s(batch, context, depth) + proposals

    def catch_up_s(self, response_tokens: float) -> float:
        """The drafter reading ``response_tokens`` (all rows together) when speculation
        switches on; 0 where the profile did not measure it."""
        rate = self.profile.drafter_catch_up_tokens_per_s
        return response_tokens / rate if rate else 0.0

    def prefill_s(self, prompt_tokens: int) -> float:
        """Prefill of ``prompt_tokens`` prompt tokens at the profile's prefill rate."""
        return prompt_tokens / self.profile.prefill_tokens_per_s
