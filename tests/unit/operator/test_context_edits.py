"""An answer budget beyond a built-in model's context, edited into an RLJob (issue #48, item
6a): the operator refuses it as the CLI does, as an invalid edit (``ValidationFailed`` naming
``spec.algorithm.maxNewTokens``), and a running or suspended job keeps its last accepted spec.
It used to take it as a frozen edit, applied after a suspend: the trainer then failed at start.
"""

from __future__ import annotations

from optest import all_pods, example, observed, spec_of
from test_spec_edits import SETTINGS, conds, configmap, message

from longtail_api.status import RLJobStatus
from longtail_operator.derive import plan


def test_an_edit_beyond_the_models_context_is_refused_and_the_accepted_spec_kept() -> None:
    accepted = example()
    up = RLJobStatus(phase="Running")
    spec = spec_of(accepted)
    for edit, pods in (
        (example(algorithm__maxNewTokens=100000), all_pods(spec)),  # running
        (example(algorithm__maxNewTokens=100000, suspend=True), []),  # suspended, pods gone
    ):
        p = plan(observed(edit, pods, configmap=configmap(accepted), previous=up), SETTINGS)
        assert conds(p)["ValidationFailed"] == ("True", "InvalidSpec")
        assert conds(p)["SpecAccepted"] == ("False", "InvalidSpec")
        shown = message(p, "ValidationFailed")
        assert "spec.algorithm.maxNewTokens" in shown and "got 100000" in shown
        assert "builtin:tiny (max_position_embeddings 2048)" in shown
        assert p.update == []  # the ConfigMap keeps the accepted spec: 256 new tokens
        assert "maxNewTokens: 100000" not in str(configmap(accepted))
    # A job that never had a valid spec runs nothing.
    fresh = plan(observed(example(algorithm__maxNewTokens=100000), []), SETTINGS)
    assert not [m for m in fresh.create if m["kind"] == "Pod"]
    assert conds(fresh)["ValidationFailed"] == ("True", "InvalidSpec")
