"""Cross-field rules of the RLJob spec: checks that no single field's bounds can express.

Called by ``manifest.validate_manifest`` after field-level parsing. Each rule returns errors
with the user-facing path and a fix. A rule whose inputs already had a field-level error is
not reported (its input was replaced by a default, so it would only add noise).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator, Mapping

from longtail_api.context import BUILTIN_MODEL_POSITIONS, context_error
from longtail_api.scheduling import GangSpec, gang_problems, scheduling_problems
from longtail_api.spec import REWARD_NAME_HINT, REWARD_NAME_PATTERN, RLJobSpec
from longtail_api.topology import KUEUE_QUEUE_LABEL, duplicate_problems
from longtail_api.tracking import tracking_errors
from longtail_api.validation import FieldError

Rule = Callable[[RLJobSpec], Iterator[tuple[FieldError, tuple[str, ...]]]]
"""A rule yields (error, paths the rule read) for each violation."""


def _drafter_source(s: RLJobSpec) -> Iterator[tuple[FieldError, tuple[str, ...]]]:
    dt = s.drafter_training
    # History strategies draft from the rollouts themselves: only learned and hybrid ones
    # need a drafter model.
    learned = any(st.drafter != "history" for st in s.speculative.strategies)
    if s.speculative.enabled and learned and not dt.enabled and not dt.initial_drafter:
        yield (
            FieldError(
                "spec.speculative.enabled",
                "speculative decoding needs a drafter for its learned and hybrid strategies, "
                "but drafterTraining.enabled is false and drafterTraining.initialDrafter is "
                "empty",
                fix="enable drafterTraining, set drafterTraining.initialDrafter, use only "
                "strategies with drafter: history, or set speculative.enabled: false",
            ),
            ("spec.speculative", "spec.drafterTraining"),
        )


BUILTIN_DRAFTERS = ("builtin:tiny", "builtin:small")
"""Built-in drafters: each is fitted on first use to the built-in model of the same name
(``workers/longtail_workers/warmstart/builtin.py``; a test keeps the two lists equal)."""


def _builtin_drafter(s: RLJobSpec) -> Iterator[tuple[FieldError, tuple[str, ...]]]:
    name = s.drafter_training.initial_drafter
    if not name or not name.startswith("builtin:"):
        return
    field = "spec.drafterTraining.initialDrafter"
    if name not in BUILTIN_DRAFTERS:
        yield (
            FieldError(
                field,
                f"unknown built-in drafter; built-in drafters: {', '.join(BUILTIN_DRAFTERS)}",
                name,
                "use the built-in drafter of the same name as model.path (builtin:tiny with "
                "model.path: builtin:tiny), or a directory written by `longtail drafter fit`",
            ),
            (field,),
        )
    elif name != s.model.path:
        yield (
            FieldError(
                field,
                f"the built-in drafter {name} drafts for the model {name} only, and model.path "
                f"is {s.model.path!r}",
                name,
                f"fit one for your model with `longtail drafter fit JOB.yaml -o DIR` and set "
                f"initialDrafter: DIR, or use model.path: {name}",
            ),
            (field, "spec.model.path"),
        )


def _strategies(s: RLJobSpec) -> Iterator[tuple[FieldError, tuple[str, ...]]]:
    sp = s.speculative
    for i, st in enumerate(sp.strategies):
        if st.verify_tokens is not None and st.verify_tokens < st.draft_depth:
            yield (
                FieldError(
                    f"spec.speculative.strategies[{i}].verifyTokens",
                    f"must be >= draftDepth ({st.draft_depth})",
                    st.verify_tokens,
                    "the target verifies at least the drafted chain; omit it for chain drafting",
                ),
                (f"spec.speculative.strategies[{i}]",),
            )
    sel = sp.selector
    if sel.type == "fixed" and sel.fixed_index >= len(sp.strategies):
        yield (
            FieldError(
                "spec.speculative.selector.fixedIndex",
                f"must be < the number of strategies ({len(sp.strategies)})",
                sel.fixed_index,
            ),
            ("spec.speculative.selector", "spec.speculative.strategies"),
        )
    b = sel.buckets
    if any(x < 1 for x in b) or any(x >= y for x, y in itertools.pairwise(b)):
        yield (
            FieldError(
                "spec.speculative.selector.buckets",
                "must be positive and strictly increasing",
                b,
                "e.g. [1, 2, 4, 8, 16, 32]",
            ),
            ("spec.speculative.selector.buckets",),
        )


def _history(s: RLJobSpec) -> Iterator[tuple[FieldError, tuple[str, ...]]]:
    """The history drafter's bounds against each other (``speculative.history``)."""
    h, path = s.speculative.history, "spec.speculative.history"
    if h.min_match > h.max_match:
        yield (
            FieldError(
                f"{path}.minMatch",
                f"must be <= maxMatch ({h.max_match}): no match could be long enough to "
                "propose anything",
                h.min_match,
                f"lower minMatch to at most {h.max_match}, or raise maxMatch",
            ),
            (path,),
        )
    if h.max_tokens_per_prompt > h.max_tokens_total:
        yield (
            FieldError(
                f"{path}.maxTokensPerPrompt",
                f"must be <= maxTokensTotal ({h.max_tokens_total}), the index's bound over all "
                "prompts",
                h.max_tokens_per_prompt,
                f"lower maxTokensPerPrompt to at most {h.max_tokens_total}, or raise "
                "maxTokensTotal",
            ),
            (path,),
        )
    hybrid = [i for i, st in enumerate(s.speculative.strategies) if st.drafter == "hybrid"]
    if hybrid and h.hybrid_min_match > h.max_match:
        yield (
            FieldError(
                f"{path}.hybridMinMatch",
                f"must be <= maxMatch ({h.max_match}) when a strategy is hybrid "
                f"(strategies[{hybrid[0]}]): no match is longer than maxMatch, so the hybrid "
                "would never draft from history",
                h.hybrid_min_match,
                f"lower hybridMinMatch to at most {h.max_match}, raise maxMatch, or use "
                "drafter: learned",
            ),
            (path, "spec.speculative.strategies"),
        )


def _harvest(s: RLJobSpec) -> Iterator[tuple[FieldError, tuple[str, ...]]]:
    h = s.harvest
    if h.enabled and h.source == "prometheus" and not h.prometheus.url:
        yield (
            FieldError(
                "spec.harvest.prometheus.url",
                "is required when harvest.source is 'prometheus'",
                fix="set the Prometheus base URL, or use source: workers",
            ),
            ("spec.harvest",),
        )
    world = s.trainer.replicas * max(1, s.trainer.resources.gpus)
    if h.enabled and "trainer" in h.eligible_roles and world > 1:
        yield (
            FieldError(
                "spec.harvest.eligibleRoles",
                f"the trainer is sharded over {world} ranks (trainer.replicas "
                f"{s.trainer.replicas} x {max(1, s.trainer.resources.gpus)} GPUs per pod), and "
                "a sharded trainer cannot train the drafter between updates (its passes through "
                "the policy are collectives of the whole group)",
                h.eligible_roles,
                "remove 'trainer' from harvest.eligibleRoles (rollout workers still harvest), "
                "or use one trainer rank (replicas: 1, at most one GPU)",
            ),
            ("spec.harvest", "spec.trainer"),
        )
    if h.enabled and not s.drafter_training.enabled:
        yield (
            FieldError(
                "spec.harvest.enabled",
                "harvesting idle GPUs trains the drafter, but drafterTraining.enabled is false",
                fix="set harvest.enabled: false or drafterTraining.enabled: true",
            ),
            ("spec.harvest", "spec.drafterTraining"),
        )
    if len(set(h.eligible_roles)) != len(h.eligible_roles):
        yield (
            FieldError("spec.harvest.eligibleRoles", "must not repeat a role", h.eligible_roles),
            ("spec.harvest.eligibleRoles",),
        )


def _vllm(s: RLJobSpec) -> Iterator[tuple[FieldError, tuple[str, ...]]]:
    """What vLLM's EAGLE-1 speculative decoding can serve exactly (docs/vllm.md)."""
    if s.rollout.engine != "vllm" or not s.speculative.enabled:
        return
    if s.drafter_training.layout != "eagle1":
        yield (
            FieldError(
                "spec.drafterTraining.layout",
                "must be 'eagle1' when rollout.engine is 'vllm' with speculative decoding on "
                "(vLLM's EAGLE-1 drafter has no input norm and no fc bias)",
                s.drafter_training.layout,
                "set drafterTraining.layout: eagle1, or speculative.enabled: false",
            ),
            ("spec.drafterTraining",),
        )
    for i, strategy in enumerate(s.speculative.strategies):
        if strategy.drafter != "learned":
            yield (
                FieldError(
                    f"spec.speculative.strategies[{i}].drafter",
                    "vLLM 0.32 cannot draft from the job's rollouts beside the learned drafter: "
                    "its 'ngram' method looks up the request's own prompt and answer only, and "
                    "'suffix' needs arctic-inference (not installed) and would replace the "
                    "EAGLE drafter, as a vLLM engine runs one speculative method (docs/vllm.md)",
                    strategy.drafter,
                    "use drafter: learned with rollout.engine: vllm, or rollout.engine: torch",
                ),
                ("spec.speculative", "spec.rollout.engine"),
            )
        if strategy.verify_tokens not in (None, strategy.draft_depth):
            yield (
                FieldError(
                    f"spec.speculative.strategies[{i}].verifyTokens",
                    "vLLM drafts chains only: verifyTokens must equal draftDepth",
                    strategy.verify_tokens,
                    "leave verifyTokens empty, or use rollout.engine: torch",
                ),
                ("spec.speculative",),
            )


def _roles(s: RLJobSpec) -> Iterator[tuple[FieldError, tuple[str, ...]]]:
    yield from _vllm(s)
    if s.drafter is not None and not s.drafter_training.enabled:
        yield (
            FieldError(
                "spec.drafter",
                "a dedicated drafter role needs drafterTraining.enabled: true",
                fix="remove spec.drafter or enable drafterTraining",
            ),
            ("spec.drafter", "spec.drafterTraining"),
        )


def _elastic(s: RLJobSpec) -> Iterator[tuple[FieldError, tuple[str, ...]]]:
    rollout = s.rollout
    if rollout.min_replicas is not None and rollout.min_replicas > rollout.replicas:
        yield (
            FieldError(
                "spec.rollout.minReplicas",
                f"more than rollout.replicas ({rollout.replicas})",
                rollout.min_replicas,
                "set minReplicas to at most replicas, or leave it empty for a fixed set",
            ),
            ("spec.rollout.minReplicas", "spec.rollout.replicas"),
        )


def _gang(s: RLJobSpec) -> Iterator[tuple[FieldError, tuple[str, ...]]]:
    gang = s.scheduling.gang
    for field, why, fix in gang_problems(gang) if gang is not None else []:
        yield FieldError(f"spec.scheduling.gang.{field}", why, fix=fix), ("spec.scheduling.gang",)


def _topology(s: RLJobSpec) -> Iterator[tuple[FieldError, tuple[str, ...]]]:
    for field, why, fix in duplicate_problems(s.scheduling.topology):
        yield FieldError(f"spec.scheduling.{field}", why, fix=fix), ("spec.scheduling.topology",)


def placement_errors(
    spec: RLJobSpec, labels: Mapping[str, str], gang: GangSpec | None
) -> list[FieldError]:
    """What the job's placer cannot express of ``spec.scheduling.topology``: not a rule of the
    spec alone, so not in :data:`RULES`. ``labels``: the RLJob's (its Kueue queue label);
    ``gang``: the gang it is placed by, the install's default included
    (``scheduling.effective_gang``). The operator reports these as it reports a gang backend
    its install does not manage (``placement.refusals``); a worker reading the job's ConfigMap,
    which has no labels, must not check them."""
    kueue = KUEUE_QUEUE_LABEL in labels
    return [
        FieldError(f"spec.scheduling.{field}", why, fix=fix)
        for field, why, fix in scheduling_problems(spec.scheduling, gang, kueue)
    ]


def _context(s: RLJobSpec) -> Iterator[tuple[FieldError, tuple[str, ...]]]:
    """A built-in model's context, known everywhere without loading it: the operator refuses
    an answer budget its workers would refuse, as ``longtail validate`` does (a local
    directory's context is checked where it is readable: ``context.spec_context_error``)."""
    positions = BUILTIN_MODEL_POSITIONS.get(s.model.path)
    if positions is None:
        return
    error = context_error(s.algorithm.max_new_tokens, positions, s.model.path)
    if error is not None:
        yield error, ("spec.algorithm.maxNewTokens", "spec.model.path")


def _reward_by_source(s: RLJobSpec) -> Iterator[tuple[FieldError, tuple[str, ...]]]:
    """``dataset.rewardBySource``: reward names by pattern, sources only where rows have one."""
    field, ds = "spec.dataset.rewardBySource", s.dataset
    if ds.reward_by_source and ds.path.startswith("builtin:"):
        yield (
            FieldError(
                field,
                f"routes rows by their data_source column, and {ds.path} is a built-in task "
                "whose items have none",
                ds.reward_by_source,
                "remove rewardBySource (dataset.reward scores every item), or use a dataset file",
            ),
            (field, "spec.dataset.path"),
        )
    for source, reward in ds.reward_by_source.items():
        if not source.strip():
            yield (
                FieldError(field, "has an empty data_source key", source, "name the source, "
                           "as in the file's data_source column, e.g. openai/gsm8k"),
                (field,),
            )  # fmt: skip
        if not re.search(REWARD_NAME_PATTERN, reward):
            yield (
                FieldError(f"{field}.{source}", f"must be {REWARD_NAME_HINT}", reward,
                           "name a registered reward, e.g. math"),
                (field,),
            )  # fmt: skip


def _tracking(s: RLJobSpec) -> Iterator[tuple[FieldError, tuple[str, ...]]]:
    for err in tracking_errors(s.tracking):
        yield err, ("spec.tracking",)


RULES: tuple[Rule, ...] = (
    _tracking,
    _reward_by_source,
    _drafter_source,
    _builtin_drafter,
    _strategies,
    _history,
    _harvest,
    _roles,
    _elastic,
    _gang,
    _topology,
    _context,
)


def check(spec: RLJobSpec, field_errors: list[FieldError]) -> list[FieldError]:
    """Cross-field errors of a parsed spec, skipping rules whose inputs were invalid."""
    bad = [e.path for e in field_errors]
    out: list[FieldError] = []
    for rule in RULES:
        for err, reads in rule(spec):
            if not any(p.startswith(r) or r.startswith(p) for p in bad for r in reads):
                out.append(err)
    return out
