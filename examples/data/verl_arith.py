"""Writes ``verl-arith.parquet``, the dataset of examples/08-verl-parquet.yaml, in veRL's layout.

Run from the repository root: ``.venv/bin/python examples/data/verl_arith.py``. The file is
checked in; ``tests/unit/workers/data/test_data_verl.py`` regenerates it and compares, so
this script and the file cannot drift apart. The rows are ``builtin:arith`` training items (the task
``builtin:tiny`` was fitted on, so the example's model answers them) written exactly as veRL's
data preparation scripts (``examples/data_preprocess/gsm8k.py``) write GSM8K:

- ``data_source``: where the row comes from (here ``longtail/arith``);
- ``prompt``: a list of chat messages (``role``, ``content``), one user turn;
- ``ability``: ``math``;
- ``reward_model``: ``{style: rule, ground_truth: <the gold answer>}``;
- ``extra_info``: ``{split, index, answer: <the worked solution>, question}``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

OUT = Path(__file__).resolve().parent / "verl-arith.parquet"
ROWS = 200
SEED = 8
SOURCE = "longtail/arith"

MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(MESSAGE)),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        (
            "extra_info",
            pa.struct(
                [
                    ("split", pa.string()),
                    ("index", pa.int64()),
                    ("answer", pa.string()),
                    ("question", pa.string()),
                ]
            ),
        ),
    ]
)


def table() -> pa.Table:
    """The dataset's rows as an Arrow table (deterministic)."""
    from longtail_workers.tasks import arith

    rows = [
        {
            "data_source": SOURCE,
            "prompt": [{"role": "user", "content": item.prompt}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": item.answer},
            "extra_info": {
                "split": "train",
                "index": i,
                "answer": item.solution,
                "question": item.prompt,
            },
        }
        for i, item in enumerate(arith.generate(ROWS, seed=SEED))
    ]
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def main() -> None:
    pq.write_table(table(), OUT)
    print(f"wrote {OUT} ({ROWS} rows)", file=sys.stderr)


if __name__ == "__main__":
    main()
