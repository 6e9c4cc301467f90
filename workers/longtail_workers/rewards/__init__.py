"""Rewards: score a model's answer against a gold answer, pluggable by name.

Used by the verifier service (``longtail_workers.verifier``) and by any code that needs a
reward in-process. The public surface, re-exported here:

- :func:`get_reward`, :func:`register_reward`, :func:`known_rewards`: the registry of reward
  functions by name (built-in: ``math``, which judges equivalence with math-verify);
- :class:`RewardResult`, :class:`RewardFn`: what a reward function returns / looks like;
- :func:`extract_final_answer`, :func:`answers_match`, :func:`combine`: the building blocks,
  for writing your own reward;
- :func:`configure_math_checker`: the math check's per-answer time limit and process count.
"""

from __future__ import annotations

from longtail_workers.rewards.checker import (
    DEFAULT_TIMEOUT_S,
    CheckerUnavailable,
    MathChecker,
    Verdict,
    configure_math_checker,
    math_checker,
)
from longtail_workers.rewards.extract import (
    MAX_SCAN_CHARS,
    ExtractedAnswer,
    extract_final_answer,
    find_final_answer,
)
from longtail_workers.rewards.math_reward import (
    MAX_CHECK_CHARS,
    answers_match,
    answers_match_verdict,
    math_reward,
)
from longtail_workers.rewards.registry import (
    RewardFn,
    UnknownRewardError,
    get_reward,
    known_rewards,
    register_reward,
    unregister_reward,
)
from longtail_workers.rewards.result import RewardResult, check_format_weight, combine

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MAX_CHECK_CHARS",
    "MAX_SCAN_CHARS",
    "CheckerUnavailable",
    "ExtractedAnswer",
    "MathChecker",
    "RewardFn",
    "RewardResult",
    "UnknownRewardError",
    "Verdict",
    "answers_match",
    "answers_match_verdict",
    "check_format_weight",
    "combine",
    "configure_math_checker",
    "extract_final_answer",
    "find_final_answer",
    "get_reward",
    "known_rewards",
    "math_checker",
    "math_reward",
    "register_reward",
    "unregister_reward",
]
