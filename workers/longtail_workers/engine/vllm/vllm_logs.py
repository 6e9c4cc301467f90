"""Known-harmless vLLM warnings, dropped at their own loggers (docs/vllm.md, "Logs").

Installed by :class:`~longtail_workers.engine.vllm.vllm_engine.VllmEngine` before it starts vLLM.
Each rule names one vLLM logger and one message, so every other warning of that logger, and every
other logger, stays as it was:

* ``vllm.renderers.base`` "Chat template warmup failed" (with a traceback): ``vllm.LLM`` renders
  a sample chat at start-up to warm its template. Longtail starts vLLM with
  ``skip_tokenizer_init=True`` and sends token ids only (the worker formats and tokenizes
  prompts itself, ``data/prompts.py``), and ``builtin:tiny`` has no chat template at all, so
  vLLM's chat rendering is never used and its warmup has nothing to render with.
* ``vllm.model_executor.model_loader.reload.layerwise`` "<X>RotaryEmbedding: Failed to load
  weights", once per rotary embedding at every policy push (``vllm_push.py``): a rotary
  embedding's only tensor is its cos/sin cache, computed from the model's config and never
  part of a checkpoint or of a policy version, so no push carries it; vLLM puts the cache it
  had back in place, which is the right value. Any other layer failing to load still warns.

Kept free of vLLM imports (the loggers are named, not imported), so it is testable without it.
"""

from __future__ import annotations

import logging

CHAT_WARMUP_LOGGER = "vllm.renderers.base"
CHAT_WARMUP_MESSAGE = "Chat template warmup failed"
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
RELOAD_MESSAGE = "%s: Failed to load weights"


class _HarmlessChatWarmup(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != CHAT_WARMUP_MESSAGE


class _HarmlessRotaryReload(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != RELOAD_MESSAGE or not isinstance(record.args, tuple) or not record.args:
            return True
        return not str(record.args[0]).endswith("RotaryEmbedding")


_RULES: dict[str, logging.Filter] = {
    CHAT_WARMUP_LOGGER: _HarmlessChatWarmup(),
    RELOAD_LOGGER: _HarmlessRotaryReload(),
}


def quiet_harmless_vllm_warnings() -> None:
    """Drop the warnings of the module text at their loggers (idempotent)."""
    for name, rule in _RULES.items():
        logger = logging.getLogger(name)
        if rule not in logger.filters:
            logger.addFilter(rule)
