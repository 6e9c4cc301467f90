"""Rewards: score a model's answer against a gold answer, pluggable by name.

Used by the verifier service (``longtail_workers.verifier``) and by any code that needs a
reward in-process. The public surface, re-exported here:

- :func:`get_reward`, :func:`register_reward`, :func:`known_rewards`: the registry of reward
  functions by name (built-in: ``math``);
- :class:`RewardResult`, :class:`RewardFn`: what a reward function returns / looks like;
- :func:`extract_final_answer`, :func:`normalize_answer`, :func:`answers_match`: the building
  blocks, for writing your own reward.
"""

from __future__ import annotations

from longtail_workers.rewards.extract import (
    MAX_SCAN_CHARS,
    ExtractedAnswer,
    extract_final_answer,
    find_final_answer,
)
from longtail_workers.rewards.math_reward import math_reward
from longtail_workers.rewards.normalize import (
    MAX_NORMALIZE_CHARS,
    NormalizedAnswer,
    answers_match,
    normalize_answer,
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
    "MAX_NORMALIZE_CHARS",
    "MAX_SCAN_CHARS",
    "ExtractedAnswer",
    "NormalizedAnswer",
    "RewardFn",
    "RewardResult",
    "UnknownRewardError",
    "answers_match",
    "check_format_weight",
    "combine",
    "extract_final_answer",
    "find_final_answer",
    "get_reward",
    "known_rewards",
    "math_reward",
    "normalize_answer",
    "register_reward",
    "unregister_reward",
]
