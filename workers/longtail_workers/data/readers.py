"""File-format readers: one ``.jsonl`` / ``.jsonl.gz`` / ``.parquet`` file -> ``list[Example]``.

Called only by :func:`longtail_workers.data.loader.load_examples`, which has already checked
that the file exists and picked the reader by extension. Each reader produces one ``dict`` per
row and hands it to :mod:`longtail_workers.data.records` for key lookup and value checks, so
both formats accept the same keys and raise the same errors; a row's ``data_source`` (veRL
files) is kept as :attr:`Example.source`. Error locations are
``<path>: row <i>`` (0-based, as in :attr:`Example.index`), plus ``(line <n>)`` for jsonl
because that is what an editor shows.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Mapping
from typing import IO, Any

from longtail_workers.data.records import (
    SOURCE_KEY,
    DatasetError,
    Example,
    Missing,
    lookup,
    to_answer,
    to_prompt,
    to_source,
)

# Spec field a user edits to fix a wrong key, by role of the key (messages quote it).
SPEC_FIELD = {"prompt": "dataset.promptKey", "answer": "dataset.answerKey"}


def read_jsonl(path: str, prompt_key: str, answer_key: str) -> list[Example]:
    """One JSON object per line (gzip-compressed for ``.gz``); blank lines are skipped."""
    examples: list[Example] = []
    line_no = 0
    with _open_text(path) as handle:
        try:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue  # blank lines (a trailing newline, a separator) are not rows
                where = f"{path}: row {len(examples)} (line {line_no})"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DatasetError(
                        f"{where}: invalid JSON ({err.msg} at column {err.colno}); each line "
                        f"must be one complete JSON object"
                    ) from err
                if not isinstance(row, dict):
                    raise DatasetError(
                        f"{where}: is a JSON {type(row).__name__}, expected an object such as "
                        f'{{"{prompt_key}": "...", "{answer_key}": "..."}}'
                    )
                examples.append(_to_example(row, len(examples), where, prompt_key, answer_key))
        except (UnicodeDecodeError, gzip.BadGzipFile, EOFError, zlib.error) as err:
            raise DatasetError(
                f"{path}: unreadable after line {line_no} ({err}); the file must be UTF-8 "
                f"text (gzip-compressed for .jsonl.gz)"
            ) from err
    return examples


def _open_text(path: str) -> IO[str]:
    # utf-8-sig: files saved by some Windows editors start with a byte-order mark that would
    # otherwise make line 1 invalid JSON.
    if path.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig")
    return open(path, encoding="utf-8-sig")


def read_parquet(path: str, prompt_key: str, answer_key: str) -> list[Example]:
    """A parquet table; only the top-level columns holding the two keys (and ``data_source``,
    where there is one) are decoded."""
    # Imported here so jsonl-only users and the tests that do not touch parquet skip its cost.
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
        names = _flatten_schema(schema, pa)
        # Read only the top-level columns that hold the two keys: datasets such as Eurus-2-RL
        # carry wide extra columns that would otherwise be decoded for nothing.
        columns = {
            role: _parquet_column(path, key, names, role)
            for role, key in (("prompt", prompt_key), ("answer", answer_key))
        }
        wanted = set(columns.values()) | ({SOURCE_KEY} & set(schema.names))
        table = pq.read_table(path, columns=sorted(wanted))
    except (pa.ArrowException, OSError) as err:
        raise DatasetError(f"{path}: not a readable parquet file ({err})") from err
    return [
        _to_example(row, i, f"{path}: row {i}", prompt_key, answer_key)
        for i, row in enumerate(table.to_pylist())
    ]


def _flatten_schema(schema: Any, pa: Any) -> dict[str, str]:
    """Every addressable key (struct fields as dotted names) -> the top-level column holding it."""
    names: dict[str, str] = {}

    def walk(prefix: str, top: str, dtype: Any) -> None:
        names[prefix] = top
        if pa.types.is_struct(dtype):
            for field in dtype:
                walk(f"{prefix}.{field.name}", top, field.type)

    for field in schema:
        walk(field.name, field.name, field.type)
    return names


def _parquet_column(path: str, key: str, names: dict[str, str], role: str) -> str:
    if key in names:
        return names[key]
    listed = ", ".join(names)
    raise DatasetError(
        f"{path}: parquet file has no column {key!r} for the {role}; columns (struct fields "
        f"dotted): {listed}; set {SPEC_FIELD[role]} to one of them"
    )


def _to_example(
    row: Mapping[str, Any], index: int, where: str, prompt_key: str, answer_key: str
) -> Example:
    prompt_value = _required(row, prompt_key, where, "prompt")
    answer_value = _required(row, answer_key, where, "answer")
    prompt, system = to_prompt(prompt_value, prompt_key, where)
    answer = to_answer(answer_value, answer_key, where)
    return Example(prompt, answer, index, system=system, source=to_source(row))


def _required(row: Mapping[str, Any], key: str, where: str, role: str) -> Any:
    value = lookup(row, key)
    if isinstance(value, Missing):
        raise DatasetError(
            f"{where}: missing {role} key {key!r}: {value.detail}; set {SPEC_FIELD[role]} to "
            f"the key holding the {role} (dots reach nested keys, e.g. reward_model.ground_truth)"
        )
    return value
