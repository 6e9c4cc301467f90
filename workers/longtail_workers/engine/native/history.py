"""The history drafter's index: an answer's next tokens proposed from the rollouts themselves.

Owned by :class:`~longtail_workers.engine.native.torch_engine.TorchEngine` (one per engine, kept
across ``generate`` calls); ``history_drafts.py`` asks it for each row's proposal before a
speculative step with a ``history`` or ``hybrid`` strategy. No model runs: the proposal is the
continuation of the longest match of the answer's newest tokens somewhere in

(a) the answer's prompt,
(b) the other answers to the same prompt in this call (the GRPO group), including those still
    being generated (their committed tokens so far),
(c) this prompt's answers from earlier calls (earlier RL steps), and, with ``whole_step``,
(d) every answer of the current call, whatever its prompt.

A prompt's history is keyed by its exact tokens, so callers need no group id. Every document
(the prompt; each answer, headed by the prompt's last ``max_match`` tokens so a match may start
in the prompt) is indexed by hash chains, as LZ77 compressors do: ``latest`` maps the hash of a
``min_match``-gram to its newest occurrence that has a continuation, and each position keeps the
previous occurrence of its own n-gram. A position is indexed only once the token after it is
committed, so a row never matches its own newest tokens (which have no continuation) and never
proposes anything but committed tokens. A lookup walks at most ``MAX_CANDIDATES`` occurrences,
newest first, measures each match backwards (up to ``max_match``) and keeps the longest (then
the one with the longer continuation, then the newest). Indexing is lazy: the engine appends
committed tokens (a list extend per row and step) and a prompt's new positions are hashed when
one of its rows first asks again, each position once. A lookup costs O(candidates x match +
depth); memory is 12 bytes a token plus about 100 per distinct ``min_match``-gram of a prompt.

Bounds (``speculative.history``): past ``max_tokens_per_prompt`` a prompt drops its oldest
finished answers; past ``max_tokens_total`` the least recently used prompts without a running
answer go first, then the oldest finished answers of the others. Running answers are never
dropped. ``clear_on_new_policy`` makes :meth:`HistoryIndex.new_policy` forget earlier calls.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from longtail_api.policies import HistorySpec

MAX_CANDIDATES = 8
"""Occurrences of the newest ``min_match`` tokens one lookup measures (newest first)."""

_POS_BITS = 32
_POS_MASK = (1 << _POS_BITS) - 1


@dataclass(eq=False)
class _Doc:
    """One token sequence of a prompt's history: the prompt itself or one answer."""

    serial: int
    tokens: array[int]
    """array("i"): the prompt's last tokens (answers), then the answer's."""
    first: int
    """First position whose n-gram may be indexed (answers: the last prompt token)."""
    live: bool


class _Chains:
    """Hash chains over a set of documents (one prompt's, or every answer of a call)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.docs: dict[int, _Doc] = {}  # serial -> document, oldest first
        self.latest: dict[int, int] = {}  # hash of an n-gram -> (serial << 32 | position)
        self.prev: dict[int, array[int]] = {}  # serial -> array("q"): previous occurrence
        self.indexed: dict[int, int] = {}  # serial -> positions hashed so far
        self.dirty: set[int] = set()  # serials with committed positions not hashed yet

    def add(self, doc: _Doc) -> None:
        self.docs[doc.serial] = doc
        self.prev[doc.serial] = array("q")
        self.indexed[doc.serial] = 0
        self.dirty.add(doc.serial)

    def drop(self, doc: _Doc) -> None:
        """Forget ``doc``: its ``latest`` entries go (chains through it end there)."""
        s, toks, n = doc.serial, doc.tokens, self.n
        for p in range(max(doc.first, n - 1), self.indexed[s]):
            key = hash(tuple(toks[p - n + 1 : p + 1]))
            if self.latest.get(key) == (s << _POS_BITS) | p:
                del self.latest[key]
        del self.docs[s], self.prev[s], self.indexed[s]
        self.dirty.discard(s)

    def catch_up(self) -> None:
        """Hash every committed position that has a continuation and is not hashed yet."""
        n, latest = self.n, self.latest
        for s in sorted(self.dirty):  # oldest first: the newest occurrence heads its chain
            doc = self.docs[s]
            toks, prev = doc.tokens, self.prev[s]
            end = len(toks) - 1  # the newest token has no continuation yet
            start = max(self.indexed[s], doc.first, n - 1)
            if len(prev) < end:
                prev.extend([-1] * (end - len(prev)))
            for p in range(start, end):
                key = hash(tuple(toks[p - n + 1 : p + 1]))
                prev[p] = latest.get(key, -1)
                latest[key] = (s << _POS_BITS) | p
            self.indexed[s] = max(self.indexed[s], end)
        self.dirty.clear()

    def search(self, query: array[int], depth: int, max_match: int) -> tuple[int, int, int, int]:
        """Best occurrence of ``query``'s newest tokens: (match, continuation, serial, pos)."""
        n, size = self.n, len(query)
        if size < n:
            return 0, 0, -1, -1
        at = self.latest.get(hash(tuple(query[size - n :])), -1)
        best = (0, 0, -1, -1)
        for _ in range(MAX_CANDIDATES):
            if at < 0:
                break
            s, p = at >> _POS_BITS, at & _POS_MASK
            doc = self.docs.get(s)
            if doc is None:  # dropped: what it pointed to is older still
                break
            toks, m = doc.tokens, 0
            limit = min(max_match, p + 1, size)
            while m < limit and toks[p - m] == query[size - 1 - m]:
                m += 1
            avail = min(depth, len(toks) - 1 - p)
            if (m, avail) > best[:2]:
                best = (m, avail, s, p)
                if m >= max_match and avail >= depth:
                    break
            at = self.prev[s][p]
        return best


@dataclass(eq=False)
class _Prompt:
    """One prompt's history: its document, its answers and their chains."""

    key: bytes
    chains: _Chains
    tokens: int = 0
    """Tokens of every document (heads included)."""
    live: set[int] = field(default_factory=set)
    """Serials of the answers still being generated."""
    finished: deque[_Doc] = field(default_factory=deque)
    """Its finished answers, in the order they finished (the first is dropped first)."""


@dataclass(eq=False)
class HistoryAnswer:
    """An answer the index follows while it is generated (``HistoryIndex.admit``)."""

    prompt: _Prompt
    doc: _Doc


class HistoryIndex:
    """Per-prompt history of answers and the longest-match proposals (see the module text)."""

    def __init__(self, spec: HistorySpec) -> None:
        self.spec = spec  # maxMatch >= minMatch: checked with the rest (sd_policy.py)
        self._prompts: OrderedDict[bytes, _Prompt] = OrderedDict()  # least recently used first
        self._step: _Chains | None = _Chains(spec.min_match) if spec.whole_step else None
        self._serial = 0
        self._full = False  # over max_tokens_total with nothing to drop until an answer ends
        self.tokens = 0
        """Tokens held over every prompt (what ``max_tokens_total`` bounds)."""

    @property
    def prompts(self) -> int:
        """Prompts with a history."""
        return len(self._prompts)

    def begin_call(self) -> None:
        """A new ``generate`` call: what came before is an earlier step's (answers a failed call
        left running are finished now)."""
        for prompt in self._prompts.values():
            for s in sorted(prompt.live):
                prompt.chains.docs[s].live = False
                prompt.finished.append(prompt.chains.docs[s])
            prompt.live.clear()
        if self._step is not None:
            self._step = _Chains(self.spec.min_match)
        self._full = False
        self._shrink()

    def new_policy(self) -> None:
        """A new policy version was loaded (between calls): forget every answer that is not
        being generated, if ``clear_on_new_policy``."""
        if not self.spec.clear_on_new_policy:
            return
        for key in list(self._prompts):
            prompt = self._prompts[key]
            if not prompt.live:
                self._drop_prompt(key)
            else:
                self._drop_oldest(prompt, 0)

    def admit(self, prompt_tokens: Sequence[int]) -> HistoryAnswer:
        """Follow a new answer to ``prompt_tokens`` (the prompt is indexed on its first use)."""
        key = array("i", prompt_tokens).tobytes()
        prompt = self._prompts.get(key)
        if prompt is None:
            prompt = _Prompt(key, _Chains(self.spec.min_match))
            self._prompts[key] = prompt
            self._add(prompt, array("i", prompt_tokens), first=0, live=False)
        else:
            self._prompts.move_to_end(key)
        head = array("i", prompt_tokens[-self.spec.max_match :])
        doc = self._add(prompt, head, first=len(head) - 1, live=True)
        if self._step is not None:
            self._step.add(doc)
        return HistoryAnswer(prompt, doc)

    def extend(self, answer: HistoryAnswer, tokens: Iterable[int]) -> None:
        """Committed tokens of ``answer`` (in order, as the engine commits them)."""
        doc, prompt = answer.doc, answer.prompt
        before = len(doc.tokens)
        doc.tokens.extend(tokens)
        grown = len(doc.tokens) - before
        if grown == 0 or doc.serial not in prompt.chains.docs:
            return
        prompt.chains.dirty.add(doc.serial)
        if self._step is not None and doc.serial in self._step.docs:
            self._step.dirty.add(doc.serial)
        prompt.tokens += grown
        self.tokens += grown
        if prompt.tokens > self.spec.max_tokens_per_prompt and prompt.finished:
            self._drop_oldest(prompt, self.spec.max_tokens_per_prompt)
        if self.tokens > self.spec.max_tokens_total and not self._full:
            self._shrink(prompt)

    def finish(self, answer: HistoryAnswer) -> None:
        """``answer`` is complete: it stays as history (until the bounds drop it)."""
        doc, prompt = answer.doc, answer.prompt
        if not doc.live:
            return
        doc.live = False
        prompt.live.discard(doc.serial)
        if doc.serial in prompt.chains.docs:
            prompt.finished.append(doc)
            self._full = False

    def propose(self, answer: HistoryAnswer, depth: int) -> tuple[list[int], int]:
        """Up to ``depth`` tokens that followed the longest match of ``answer``'s newest tokens,
        and the match's length; ``([], 0)`` when no match reaches ``min_match``."""
        prompt, query = answer.prompt, answer.doc.tokens
        if answer.doc.serial not in prompt.chains.docs:
            return [], 0  # only after a failed call left it behind
        self._prompts.move_to_end(prompt.key)
        spec = self.spec
        prompt.chains.catch_up()
        found = prompt.chains.search(query, depth, spec.max_match)
        chains = prompt.chains
        if self._step is not None:
            self._step.catch_up()
            other = self._step.search(query, depth, spec.max_match)
            if other[:2] > found[:2]:
                found, chains = other, self._step
        match, avail, s, p = found
        if match < spec.min_match:
            return [], 0
        toks = chains.docs[s].tokens
        return toks[p + 1 : p + 1 + avail].tolist(), match

    # -- bookkeeping -------------------------------------------------------------------------

    def _add(self, prompt: _Prompt, tokens: array[int], first: int, live: bool) -> _Doc:
        doc = _Doc(self._serial, tokens, first, live)
        self._serial += 1
        prompt.chains.add(doc)
        if live:
            prompt.live.add(doc.serial)
        prompt.tokens += len(tokens)
        self.tokens += len(tokens)
        return doc

    def _drop_answer(self, prompt: _Prompt, doc: _Doc) -> None:
        prompt.chains.drop(doc)
        prompt.tokens -= len(doc.tokens)
        self.tokens -= len(doc.tokens)

    def _drop_prompt(self, key: bytes) -> None:
        prompt = self._prompts.pop(key)
        self.tokens -= prompt.tokens
        prompt.chains.docs.clear()  # answers still followed see they are gone

    def _drop_oldest(self, prompt: _Prompt, bound: int) -> None:
        """Drop ``prompt``'s oldest finished answers until it holds at most ``bound`` tokens
        (the prompt document and running answers stay)."""
        while prompt.finished and prompt.tokens > bound:
            self._drop_answer(prompt, prompt.finished.popleft())

    def _shrink(self, current: _Prompt | None = None) -> None:
        """Apply ``max_tokens_total`` (least recently used prompts without running answers
        first, ``current`` last); what one prompt holds is bounded as it grows."""
        bound = self.spec.max_tokens_total
        self._full = False
        for key in list(self._prompts):
            if self.tokens <= bound:
                return
            prompt = self._prompts[key]
            if not prompt.live and prompt is not current:
                self._drop_prompt(key)
        for prompt in list(self._prompts.values()):
            if self.tokens <= bound:
                return
            self._drop_oldest(prompt, prompt.tokens - (self.tokens - bound))
        self._full = self.tokens > bound
