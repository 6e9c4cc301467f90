"""The trainer group's rendezvous environment (api/longtail_api/rendezvous.py): what the operator
and `longtail run` write, the trainer reads back, and every bad value named."""

from __future__ import annotations

import pytest

from longtail_api.protocol import ProtocolError
from longtail_api.rendezvous import TrainerRendezvous


def test_round_trip_and_ranks() -> None:
    rdv = TrainerRendezvous("job-trainer-0.job-trainer.ns.svc", 29501, 2, 1, 4)
    env = rdv.to_env()
    assert env == {
        "MASTER_ADDR": "job-trainer-0.job-trainer.ns.svc",
        "MASTER_PORT": "29501",
        "NNODES": "2",
        "NODE_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "WORLD_SIZE": "8",
    }
    assert TrainerRendezvous.from_env(env) == rdv
    assert rdv.world_size == 8 and [rdv.rank(i) for i in range(4)] == [4, 5, 6, 7]
    assert rdv.init_method == "tcp://job-trainer-0.job-trainer.ns.svc:29501"


def test_no_variables_is_a_lone_trainer() -> None:
    assert TrainerRendezvous.from_env({"PATH": "/bin"}) is None


def test_defaults_fill_port_and_local_world() -> None:
    rdv = TrainerRendezvous.from_env({"MASTER_ADDR": "h", "NNODES": "2", "NODE_RANK": "0"})
    assert rdv == TrainerRendezvous("h", 29500, 2, 0, 1)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"MASTER_ADDR": "h"}, "NNODES, NODE_RANK missing"),
        ({"MASTER_ADDR": "h", "NNODES": "2", "NODE_RANK": "2"}, "NODE_RANK: must be in [0, "),
        ({"MASTER_ADDR": "h", "NNODES": "two", "NODE_RANK": "0"}, "NNODES: must be an integer"),
        (
            {"MASTER_ADDR": "h", "NNODES": "2", "NODE_RANK": "0", "WORLD_SIZE": "3"},
            "WORLD_SIZE: must equal NNODES x LOCAL_WORLD_SIZE = 2",
        ),
        (
            {"MASTER_ADDR": "h", "NNODES": "1", "NODE_RANK": "0", "MASTER_PORT": "0"},
            "MASTER_PORT: must be a TCP port",
        ),
    ],
)
def test_bad_environments_name_the_variable(env: dict[str, str], expected: str) -> None:
    with pytest.raises(ProtocolError, match=expected.replace("[", r"\[")):
        TrainerRendezvous.from_env(env)


def test_local_rank_out_of_range() -> None:
    with pytest.raises(ProtocolError, match="LOCAL_RANK"):
        TrainerRendezvous("h", local_world_size=2).rank(2)
