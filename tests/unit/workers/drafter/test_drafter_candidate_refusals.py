"""Issue #48 item 8: a refused or overtaken drafter candidate is dropped once and leaves a trace.

Real objects throughout: a tiny random Qwen2 policy, a drafter fitted by the real spot trainer,
the trainer's real HTTP surface (``TrainerApp`` + ``DrafterEndpoints``, real sockets) with the
rollout workers' client (``RemoteDrafterRegistry``), the trainer's merge checks
(``trainer/candidate_checks.py``) and ``longtail run``'s report. Covers:

(a) a candidate the quality gate refuses is deleted from the registry, counted and logged once
    with its score against the bar, and never scored again at the next steps' merges;
    malformed and worse-but-well-formed refusals are counted apart (``reason`` label);
(b) an upload accepted (201) while a merge is running is merged by the next merge when the
    running one publishes nothing, and is logged and counted as superseded when it publishes;
(c) every 400 of the upload route is one trainer log line naming the field and the value and
    one count with its reason; ``policy_version`` is checked against the trainer's; the 201
    answer names the candidate by id, never by the trainer's path;
(d) when no online version was published, the trainer's status, the step rows and the run's
    report say why, and the closing lines word each refusal count by its reason.
"""

from __future__ import annotations

import functools
import io
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from helpers import candidate_body, constant_drafter, post_candidate, rejected_metric
from httpcall import http_json
from tiny_targets import random_prompts

from longtail_api.drafterstatus import NO_CANDIDATE
from longtail_api.policies import DrafterTrainingSpec
from longtail_api.steprow import METRICS_FILE, StepRow
from longtail_workers.drafter.exchange import (
    DrafterEndpoints,
    DrafterExchangeError,
    RemoteDrafterRegistry,
)
from longtail_workers.drafter.model import EagleDrafter
from longtail_workers.drafter.refusals import Refusal
from longtail_workers.drafter.registry import (
    CANDIDATE_FILE,
    Admitted,
    CandidateInfo,
    DrafterRegistry,
    StoredCandidate,
)
from longtail_workers.engine.interface import GenerationRequest
from longtail_workers.engine.native.torch_engine import TorchEngine
from longtail_workers.local.progress import Progress
from longtail_workers.local.report import write_report
from longtail_workers.local.run import print_summary
from longtail_workers.spot.buffer import RolloutBuffer
from longtail_workers.spot.trainer import SpotTrainer
from longtail_workers.trainer.candidate_checks import CandidateChecks, HeldoutSample, WindowLedger
from longtail_workers.trainer.driver import DriverState
from longtail_workers.trainer.service import TrainerApp
from longtail_workers.trainer.syncbook import SyncBook
from longtail_workers.weights.checksum import sha256_hex
from longtail_workers.wire.rollout import GenerateReply, Sample

TID = "tiny-refusals"
VOCAB = 48
SPEC = DrafterTrainingSpec(learning_rate=3e-3, window_tokens=32, max_steps_per_window=10_000)
QUERY = {"worker": "w0", "policy_version": "1", "tokens": "5", "steps": "1"}
REFUSALS_LOG = "longtail_workers.drafter.refusals"

constant = functools.partial(constant_drafter, target_id=TID)


@pytest.fixture(scope="module")
def drafters(target) -> dict[str, EagleDrafter]:
    """``current``: a drafter fitted for 40 steps (the version workers draft with);
    ``useless``: fresh random weights of the right shapes (a worse candidate)."""
    reqs = [
        GenerationRequest(p, max_new_tokens=48, temperature=1.0, seed=i, return_hidden_states=True)
        for i, p in enumerate(random_prompts(0, 64, VOCAB))
    ]
    buf = RolloutBuffer(max_tokens=100_000, max_bytes=1 << 30)
    buf.add_results(TorchEngine(target).generate(reqs), policy_version=0, step=0)
    spot = SpotTrainer(EagleDrafter(target, target_id=TID, seed=1), buf, SPEC, pack_tokens=64)
    spot.start(40)
    assert spot.wait_stopped(120.0)
    spot.raise_if_failed()
    return {"current": spot.drafter_copy(), "useless": EagleDrafter(target, target_id=TID, seed=9)}


@pytest.fixture(scope="module")
def step_answers(target) -> list[Sample]:
    """The answers of the step being merged: the trainer's held-out sample."""
    reqs = [
        GenerationRequest(p, max_new_tokens=48, temperature=1.0, seed=7000 + i,
                          request_id=f"s1-p{i // 2}-g{i % 2}")
        for i, p in enumerate(random_prompts(7, 48, VOCAB))
    ]  # fmt: skip
    return [Sample.of(r) for r in TorchEngine(target).generate(reqs)]


def gate_for(
    target: torch.nn.Module,
    answers: list[Sample],
    workers: Sequence[str],
    base: int | None = 0,
    initial: EagleDrafter | None = None,
) -> CandidateChecks:
    """The trainer's checks as the step driver feeds them: ``workers`` generated the step's
    answers while ``base`` was the latest; the sample is those answers under the policy."""
    ledger = WindowLedger()
    share = len(answers) // len(workers)
    ledger.record_rollout(base, [
        GenerateReply(worker=w, policy_version=0, drafter_version=0,
                      samples=answers[i * share : (i + 1) * share])
        for i, w in enumerate(workers)
    ])  # fmt: skip
    sample = HeldoutSample(SPEC)
    sample.refresh(target, answers, policy_version=1)
    return CandidateChecks(ledger, sample, initial=initial)


def client(app: TrainerApp, tmp_path: Path, name: str = "w") -> RemoteDrafterRegistry:
    return RemoteDrafterRegistry(app.url, cache_dir=tmp_path / f"cache-{name}", retries=0)


def refusal_lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == REFUSALS_LOG and text in r.getMessage()
    ]


# --- (a) a refused candidate is dropped: counted and logged once, never scored again ----------


def test_a_candidate_the_quality_gate_refuses_is_dropped_and_never_scored_again(
    target, drafters, step_answers, tmp_path, caplog, monkeypatch
) -> None:
    registry = DrafterRegistry(tmp_path)
    registry.publish(drafters["current"], policy_version=0)
    gate = gate_for(target, step_answers, ["w-worse"])
    bar, _ = gate.sample.score(drafters["current"])  # type: ignore[union-attr]
    worse, _ = gate.sample.score(drafters["useless"])  # type: ignore[union-attr]
    assert bar is not None and worse is not None and worse < bar
    scored: list[int] = []
    real = HeldoutSample.score
    monkeypatch.setattr(HeldoutSample, "score", lambda self, d: scored.append(1) or real(self, d))
    info = CandidateInfo("w-worse", 0, policy_version=1, tokens=500, steps=3)
    registry.submit_candidate(drafters["useless"], info)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):  # three steps' merges: the first judges it, the others find nothing
            assert registry.merge_candidates(target, target_id=TID, gate=gate) is None
    assert len(scored) == 2  # the current version and the candidate, at the first merge only
    assert registry.candidates(0) == []
    assert not list((registry.root / "candidates").rglob(CANDIDATE_FILE))  # deleted
    assert registry.rejected == {"merge": 1} and registry.refusals.counts() == {"worse": 1}
    lines = refusal_lines(caplog, "w-worse")
    assert len(lines) == 1 and "(worse)" in lines[0], lines
    assert f"{worse:.3f}" in lines[0] and f"below {bar:.3f}" in lines[0]


def test_malformed_and_worse_refusals_are_counted_apart(
    target, drafters, step_answers, trainer, tmp_path
) -> None:
    app, registry = trainer
    registry.publish(drafters["current"], policy_version=0)
    worker = client(app, tmp_path)
    with pytest.raises(DrafterExchangeError, match="HTTP 400"):
        nan = CandidateInfo("w-nan", 0, policy_version=1, tokens=5, steps=1)
        worker.submit_candidate(constant(target, float("nan")), nan)
    worse = CandidateInfo("w-worse", 0, policy_version=1, tokens=500, steps=3)
    worker.submit_candidate(drafters["useless"], worse)
    gate = gate_for(target, step_answers, ["w-worse"])
    assert registry.merge_candidates(target, target_id=TID, gate=gate) is None
    assert rejected_metric(app, "upload", "malformed") == 1.0
    assert rejected_metric(app, "merge", "worse") == 1.0
    assert rejected_metric(app, "merge", "malformed") == 0.0
    assert registry.refusals.counts() == {"malformed": 1, "worse": 1}
    assert registry.refusals.take_new() == {"malformed": 1, "worse": 1}  # the step row's
    assert registry.refusals.take_new() == {}


# --- (b) an upload that lands while a merge runs ---------------------------------------------


class LateUploadGate:
    """A gate that lets every candidate in at its own tokens (or refuses them all) and, while
    it judges them, runs ``upload``: a worker's upload landing while the merge scores."""

    def __init__(self, upload: Callable[[], object], refuse_all: bool = False) -> None:
        self.upload, self.refuse_all = upload, refuse_all

    def initial_drafter(self) -> EagleDrafter | None:
        return None

    def admit(
        self,
        base: int | None,
        usable: Sequence[tuple[StoredCandidate, dict[str, torch.Tensor]]],
        scratch: EagleDrafter,
        current: EagleDrafter | None,
    ) -> tuple[list[Admitted], list[Refusal]]:
        self.upload()
        if self.refuse_all:
            why = "scores below the current version (test)"
            return [], [Refusal("merge", "worse", c.worker, why, top1=0.1, bar=0.2)
                        for c, _ in usable]  # fmt: skip
        return [Admitted(c, w, c.tokens, None) for c, w in usable], []

    def judge_merge(
        self, merged: EagleDrafter, current: EagleDrafter | None
    ) -> tuple[float | None, Refusal | None]:
        return None, None


def test_an_upload_accepted_while_a_version_is_published_is_counted_superseded(
    target, trainer, tmp_path, caplog
) -> None:
    app, registry = trainer
    registry.publish(constant(target, 0.0), policy_version=0)
    worker = client(app, tmp_path)
    worker.submit_candidate(constant(target, 1.0), CandidateInfo("w-a", 0, 1, 10, 1))
    accepted = []
    late = CandidateInfo("w-late", 0, policy_version=1, tokens=10, steps=1)
    gate = LateUploadGate(
        lambda: accepted.append(worker.submit_candidate(constant(target, 2.0), late))
    )
    with caplog.at_level(logging.WARNING):
        published = registry.merge_candidates(target, target_id=TID, gate=gate)
    assert published is not None and published.meta.merged_from == ("w-a",)
    assert len(accepted) == 1 and accepted[0].worker == "w-late"  # it was answered 201
    assert rejected_metric(app, "superseded", "superseded") == 1.0
    lines = refusal_lines(caplog, "w-late")
    assert len(lines) == 1 and "superseded" in lines[0] and accepted[0].id in lines[0]
    assert "drafter version 1 was published" in lines[0]
    assert registry.candidates(0) == [] and registry.candidates(1) == []


def test_an_upload_accepted_during_a_merge_that_publishes_nothing_is_merged_next(
    target, trainer, tmp_path
) -> None:
    app, registry = trainer
    registry.publish(constant(target, 0.0), policy_version=0)
    worker = client(app, tmp_path)
    worker.submit_candidate(constant(target, 1.0), CandidateInfo("w-a", 0, 1, 10, 1))
    late = CandidateInfo("w-late", 0, policy_version=1, tokens=10, steps=1)
    refusing = LateUploadGate(
        lambda: worker.submit_candidate(constant(target, 2.0), late), refuse_all=True
    )
    assert registry.merge_candidates(target, target_id=TID, gate=refusing) is None
    assert [c.worker for c in registry.candidates(0)] == ["w-late"]  # w-a was judged: gone
    published = registry.merge_candidates(target, target_id=TID)
    assert published is not None and published.meta.merged_from == ("w-late",)
    assert registry.rejected == {"merge": 1}  # w-a, once; nothing superseded


# --- (c) the upload route's 400s, policy_version, the 201 answer ----------------------------


def _query(**change: str) -> str:
    return "&".join(f"{k}={v}" for k, v in {**QUERY, **change}.items())


@pytest.mark.parametrize(
    ("change", "reason", "named"),
    [
        ({"train_loss": "nan"}, "query", ["query.train_loss", "got 'nan'"]),
        ({"train_loss": "NaN"}, "query", ["query.train_loss", "got NaN"]),
        ({"heldout_top1": "Infinity"}, "query", ["query.heldout_top1", "got Infinity"]),
        ({"tokens": "-5"}, "query", ["query.tokens", "got -5"]),
        ({"tokens": "1e400"}, "query", ["query.tokens", "got Infinity"]),
        ({"policy_version": "999"}, "policy_version",
         ["query.policy_version: 999", "newer than the trainer's policy version 2"]),
    ],
)  # fmt: skip
def test_every_400_is_one_log_line_naming_the_field_and_one_count(
    target, trainer, tmp_path, caplog, change: dict[str, str], reason: str, named: list[str]
) -> None:
    app, registry = trainer
    body = candidate_body(constant(target, 1.0), tmp_path)
    with caplog.at_level(logging.WARNING):
        status, error = post_candidate(app.url, body, sha256_hex(body), _query(**change))
    assert status == 400 and all(part in error for part in named), error
    lines = refusal_lines(caplog, "")
    assert len(lines) == 1 and all(part in lines[0] for part in named), lines
    assert f"({reason})" in lines[0] and "w0" in lines[0]
    assert rejected_metric(app, "upload", reason) == 1.0
    assert registry.candidates(None) == []


def test_a_policy_version_older_than_the_allowed_lag_is_refused(
    target, trainer, tmp_path, caplog
) -> None:
    app, registry = trainer
    app.drafters = DrafterEndpoints(registry, policy_version=lambda: 10, max_policy_lag=4)
    body = candidate_body(constant(target, 1.0), tmp_path)
    with caplog.at_level(logging.WARNING):
        status, error = post_candidate(app.url, body, sha256_hex(body), _query(policy_version="5"))
    assert status == 400, error
    assert "query.policy_version: 5 is older than 6" in error and "policy version is 10" in error
    assert len(refusal_lines(caplog, "query.policy_version: 5")) == 1
    assert rejected_metric(app, "upload", "policy_version") == 1.0
    status, _ = post_candidate(app.url, body, sha256_hex(body), _query(policy_version="6"))
    assert status == 201


def test_a_corrupted_upload_is_logged_and_counted_as_a_bad_request(
    target, trainer, tmp_path, caplog
) -> None:
    app, _ = trainer
    body = candidate_body(constant(target, 1.0), tmp_path)
    with caplog.at_level(logging.WARNING):
        status, error = post_candidate(app.url, body, "0" * 64, _query())
    assert status == 400 and "upload was corrupted" in error
    lines = refusal_lines(caplog, "upload was corrupted")
    assert len(lines) == 1 and "(request)" in lines[0]
    assert rejected_metric(app, "upload", "request") == 1.0


def test_the_201_answer_names_the_candidate_not_the_trainers_path(
    target, trainer, tmp_path
) -> None:
    app, registry = trainer
    body = candidate_body(constant(target, 1.0), tmp_path)
    status, raw = post_candidate(app.url, body, sha256_hex(body), _query())
    assert status == 201
    answer = json.loads(raw)
    assert "path" not in answer and str(tmp_path) not in raw
    stored = registry.candidates(None)
    assert [c.id for c in stored] == [answer["id"]] and answer["worker"] == "w0"
    cand = client(app, tmp_path).submit_candidate(
        constant(target, 1.0), CandidateInfo("w1", None, policy_version=2, tokens=5, steps=1)
    )
    assert cand.id in {c.id for c in registry.candidates(None)} and not hasattr(cand, "path")


# --- (d) why no online version was published ------------------------------------------------


class _Driver:
    """What ``GET /v1/status`` reads of the step driver."""

    def __init__(self) -> None:
        self.state = DriverState(total_steps=5, step=2, policy_version=2)
        self.syncs = SyncBook()


def test_the_status_says_why_no_version_was_published(
    target, drafters, step_answers, trainer, tmp_path
) -> None:
    app, registry = trainer
    app.driver = _Driver()  # type: ignore[assignment]
    status, body = http_json(app.url + "/v1/status")
    assert status == 200 and body["drafterMerges"]["unpublished"].startswith(NO_CANDIDATE)
    # The job's initial drafter is the current version until a version is published.
    gate = gate_for(target, step_answers, ["w-0", "w-1"], base=None, initial=drafters["current"])
    bar, _ = gate.sample.score(drafters["current"])  # type: ignore[union-attr]
    best, _ = gate.sample.score(drafters["useless"])  # type: ignore[union-attr]
    worker = client(app, tmp_path)
    for name in ("w-0", "w-1"):
        info = CandidateInfo(name, None, policy_version=2, tokens=500, steps=3)
        worker.submit_candidate(drafters["useless"], info)
    assert registry.merge_candidates(target, target_id=TID, gate=gate) is None
    status, body = http_json(app.url + "/v1/status")
    merges = body["drafterMerges"]
    assert merges["candidates"] == 2 and merges["published"] == 0
    assert merges["refused"] == {"worse": 2}
    assert merges["unpublished"] == (
        f"every candidate (2) scored below the initial drafter's held-out top-1 {bar:.3f} on "
        f"the trainer's sample (best {best:.3f}), so the workers keep drafting with the "
        "initial drafter"
    )
    registry.publish(drafters["current"], policy_version=2)
    assert http_json(app.url + "/v1/status")[1]["drafterMerges"]["unpublished"] is None


def _rows(run_dir: Path, rows: list[StepRow]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(r.to_dict()) + "\n" for r in rows)
    (run_dir / METRICS_FILE).write_text(lines)


def _row(step: int, **drafter: object) -> StepRow:
    return StepRow(step=step, policy_version=step, drafter_version=-1, reward_mean=0.5,
                   accuracy=0.5, rollout_s=2.0, tail_s=0.5, train_s=1.0, step_s=3.5,
                   idle_s=1.5, harvested_s=0.0, **drafter)  # type: ignore[arg-type]  # fmt: skip


INFO = {
    "outcome": "complete", "reason": None, "wall_s": 9.0, "start_eval_accuracy": None,
    "start_eval_sampled_accuracy": None, "lost_workers": [], "restarted_workers": [],
}  # fmt: skip


def test_the_report_and_the_closing_lines_say_why_and_word_each_refusal(tmp_path) -> None:
    why = (
        "every candidate (3) scored below the initial drafter's held-out top-1 0.430 on the "
        "trainer's sample (best 0.412), so the workers keep drafting with the initial drafter"
    )
    _rows(tmp_path, [
        _row(1, drafter_candidates_rejected=2, drafter_refused={"worse": 1, "malformed": 1},
             drafter_unpublished=why),
        _row(2, drafter_candidates_rejected=2, drafter_refused={"worse": 2},
             drafter_unpublished=why),
    ])  # fmt: skip
    summary = write_report(tmp_path, None, dict(INFO))
    assert summary["drafter_candidates_rejected"] == 4
    assert summary["drafter_candidates_refused"] == {"worse": 3, "malformed": 1}
    assert summary["drafter_unpublished"] == why
    md = (tmp_path / "report" / "summary.md").read_text()
    assert why in md and "worse 3, malformed 1" in md
    out = io.StringIO()
    print_summary(Progress(out), summary, tmp_path, 0)
    text = out.getvalue()
    assert "warning: 4 drafter candidate(s) were refused: 1 failed the check against the job's " \
           "drafter" in text  # fmt: skip
    assert "3 scored below the current drafter version on the trainer's held-out sample" in text
    assert f"warning: no online drafter version was published: {why}" in text
    assert "(not the job's drafter, or NaN/inf weights)" not in text


def test_the_report_of_a_run_without_candidates_adds_the_harvest(tmp_path) -> None:
    why = f"{NO_CANDIDATE}: no drafter window ended with a candidate for the trainer"
    _rows(tmp_path, [_row(1, drafter_unpublished=why), _row(2, drafter_unpublished=why)])
    summary = write_report(tmp_path, None, dict(INFO))
    assert summary["drafter_unpublished"] == (
        f"{why}; this run harvested 0.0 of 3.0 idle worker-seconds"
    )
    assert "drafter_candidates_refused" not in summary
