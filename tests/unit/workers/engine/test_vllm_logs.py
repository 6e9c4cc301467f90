"""The known-harmless vLLM warnings are dropped, and nothing else (issue #48 item 11).

Example 04's worker logs carried a "Chat template warmup failed" traceback at every start and
one "RotaryEmbedding: Failed to load weights" line per policy push; ``engine/vllm/vllm_logs.py``
drops exactly those at their own loggers (why each is harmless: its module text and
docs/vllm.md). Records are sent through the real logger objects vLLM uses; where vLLM is
installed, its modules are checked to still log those messages on those loggers.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Iterator

import pytest

from longtail_workers.engine.vllm.vllm_logs import (
    CHAT_WARMUP_LOGGER,
    CHAT_WARMUP_MESSAGE,
    RELOAD_LOGGER,
    RELOAD_MESSAGE,
    quiet_harmless_vllm_warnings,
)


class Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept() -> Iterator[Keep]:
    """Every record of the two loggers, their filters removed for the test (a vLLM engine
    started earlier in this process installed them) and put back after."""
    keep = Keep()
    loggers = [logging.getLogger(n) for n in (CHAT_WARMUP_LOGGER, RELOAD_LOGGER)]
    saved = [list(logger.filters) for logger in loggers]
    for logger in loggers:
        logger.filters.clear()
        logger.addHandler(keep)
    yield keep
    for logger, filters in zip(loggers, saved, strict=True):
        logger.removeHandler(keep)
        logger.filters[:] = filters


def _warn_all() -> None:
    chat, reload = logging.getLogger(CHAT_WARMUP_LOGGER), logging.getLogger(RELOAD_LOGGER)
    try:
        raise ValueError("no tokenizer: skip_tokenizer_init")
    except ValueError:
        chat.warning(CHAT_WARMUP_MESSAGE, exc_info=True)
    reload.warning(RELOAD_MESSAGE, "RotaryEmbedding")
    reload.warning(RELOAD_MESSAGE, "MRotaryEmbedding")
    reload.warning(RELOAD_MESSAGE, "QKVParallelLinear")  # a real failure: still warned
    chat.warning("Some other renderer warning")
    reload.warning("Allocating %.1f MB of device memory", 3.0)


def test_exactly_the_harmless_warnings_are_dropped(kept: Keep) -> None:
    _warn_all()
    assert len(kept.records) == 6  # without the filters every one gets through
    kept.records.clear()
    quiet_harmless_vllm_warnings()
    quiet_harmless_vllm_warnings()  # idempotent: one filter per logger
    _warn_all()
    assert [r.getMessage() for r in kept.records] == [
        "QKVParallelLinear: Failed to load weights",
        "Some other renderer warning",
        "Allocating 3.0 MB of device memory",
    ]
    assert len(logging.getLogger(CHAT_WARMUP_LOGGER).filters) == 1


def test_vllm_still_logs_those_messages_on_those_loggers() -> None:
    if sys.platform != "linux":
        pytest.skip("vLLM runs on Linux only")
    base = pytest.importorskip("vllm.renderers.base")
    from vllm.model_executor.model_loader.reload import layerwise

    for module, name, message in (
        (base, CHAT_WARMUP_LOGGER, CHAT_WARMUP_MESSAGE),
        (layerwise, RELOAD_LOGGER, RELOAD_MESSAGE),
    ):
        assert module.logger.name == name
        assert f'"{message}"' in inspect.getsource(module), (name, message)
