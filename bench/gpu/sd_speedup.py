"""Speculative decoding's speedup over plain decoding, per batch size, from an engine profile.

Run by ``bench/gpu/run.sh`` (stage ``speedup``) on the profile the GPU session just measured, or
by hand on any profile (``longtail profile`` output, ``api/longtail_api/profile.py``)::

    python bench/gpu/sd_speedup.py --profile PROFILE.json [--profile MORE.json] \
        --accepted 3,4.6 [--context 2048] [--out sd_speedup.json]

Pure Python (the profile schema only, no torch). For every context and batch size ``B`` in the
profile and every mean accepted length ``L`` (tokens a row gains per speculative step, accepted
drafts + 1) it reports, for each draft depth ``k`` with ``k + 1 >= L`` (a step of depth k can
emit at most k + 1 tokens)::

    speedup(B, k) = L x t_decode(B) / t_sd(B, k)

``t_decode`` is the profile's plain decode step. ``t_sd`` is the measured whole speculative
step (the profile's ``speculative`` curve: drafting, verify, sampling, bookkeeping) where the
profile has it, else ``k x t_draft + t_verify(k + 1)`` from the bare forwards, which leaves out
the step's sampling and bookkeeping and so flatters SD; every entry says which was used. It also
reports the best depth per batch size and the smallest batch size at which the best speedup
drops below 1 (where SD "stops paying"). A profile's speculative steps were timed keeping a fixed
number of drafts per row (its notes say how many); their cost at another ``L`` differs a little.
Several ``--profile`` files of one model are merged (later files win on the same point).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "api"))  # only the API package: bench/ itself shadows stdlib names

from longtail_api.profile import EngineProfile, ProfileError, StepPoint  # noqa: E402

Key = tuple[int, int, int]
"""(batch, context, tokens) of a profile point."""


@dataclass(frozen=True)
class Curves:
    """A merged profile's points by key."""

    decode: dict[Key, float]
    verify: dict[Key, float]
    draft: dict[Key, float]
    speculative: dict[Key, float]


def _index(points: list[StepPoint]) -> dict[Key, float]:
    return {(p.batch, p.context, p.tokens): p.seconds for p in points}


def merge(profiles: list[EngineProfile]) -> Curves:
    """The union of the profiles' points; ValueError if they were taken on different models."""
    first = profiles[0]
    for p in profiles[1:]:
        if p.model != first.model:
            raise ValueError(f"profiles of different models: {first.model} vs {p.model}")
    curves = Curves({}, {}, {}, {})
    for p in profiles:
        for name in ("decode", "verify", "draft", "speculative"):
            getattr(curves, name).update(_index(getattr(p, name)))
    return curves


def sd_seconds(c: Curves, batch: int, context: int, k: int) -> tuple[float, str] | None:
    """``(seconds of one speculative step of depth k, "engine" | "forwards")`` or None."""
    whole = c.speculative.get((batch, context, k + 1))
    if whole is not None:
        return whole, "engine"
    verify = c.verify.get((batch, context, k + 1))
    draft = c.draft.get((batch, context, 1))
    if verify is None or draft is None:
        return None
    return k * draft + verify, "forwards"


def depths_of(c: Curves) -> list[int]:
    """Draft depths the profile has a speculative step or a verify pass for."""
    return sorted({t - 1 for (_, _, t) in [*c.speculative, *c.verify] if t >= 2})


def analyse(c: Curves, context: int, accepted: float) -> dict[str, Any]:
    """Speedups at one context and mean accepted length (see the module text)."""
    depths = [k for k in depths_of(c) if k + 1 >= accepted]
    batches = sorted(b for (b, ctx, t) in c.decode if ctx == context and t == 1)
    rows: list[dict[str, Any]] = []
    stops_at: int | None = None
    for b in batches:
        decode = c.decode[(b, context, 1)]
        entries = []
        for k in depths:
            sd = sd_seconds(c, b, context, k)
            if sd is None:
                continue
            seconds, source = sd
            speedup = accepted * decode / seconds
            entries.append({"depth": k, "sd_step_s": seconds, "source": source,
                            "speedup": speedup})  # fmt: skip
        best = max(entries, key=lambda e: e["speedup"], default=None)
        rows.append({
            "batch": b,
            "decode_s": decode,
            "depths": entries,
            "best_depth": best["depth"] if best else None,
            "best_speedup": best["speedup"] if best else None,
        })  # fmt: skip
        if stops_at is None and best is not None and best["speedup"] < 1.0:
            stops_at = b
    return {
        "context": context,
        "accepted_length": accepted,
        "depths": depths,
        "stops_paying_at_batch": stops_at,
        "batches": rows,
    }


def table(result: dict[str, Any]) -> str:
    """One result as a plain-text table (milliseconds and speedups)."""
    depths: list[int] = result["depths"]
    columns = "".join(f" {f'k={k} ms':>10} {'x':>6}" for k in depths)
    lines = [
        f"context {result['context']}, accepted length {result['accepted_length']:g} "
        f"(depths with k+1 >= L: {depths or 'none'})",
        f"{'batch':>6} {'decode ms':>10}{columns} {'best':>10}",
    ]
    for row in result["batches"]:
        by_k = {e["depth"]: e for e in row["depths"]}
        line = f"{row['batch']:>6} {row['decode_s'] * 1e3:>10.3f}"
        for k in depths:
            e = by_k.get(k)
            if e is None:
                line += f" {'-':>10} {'-':>6}"
            else:
                mark = "" if e["source"] == "engine" else "*"
                line += f" {e['sd_step_s'] * 1e3:>9.3f}{mark:1} {e['speedup']:>6.2f}"
        if row["best_depth"] is not None:
            line += f" {'k=' + str(row['best_depth']):>4} {row['best_speedup']:>5.2f}"
        lines.append(line)
    stops = result["stops_paying_at_batch"]
    if not depths:
        lines.append("no profiled depth can keep this accepted length (needs k + 1 >= L)")
    elif stops is None:
        lines.append("SD pays at every profiled batch size")
    else:
        lines.append(f"SD stops paying at batch {stops} (best speedup below 1)")
    return "\n".join(lines)


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated numbers") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: accepted lengths are >= 1 (drafts + 1)")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--profile", action="append", required=True, type=Path,
        help="engine profile JSON (repeat to merge profiles of one model)",
    )  # fmt: skip
    ap.add_argument(
        "--accepted", type=_floats, default=[3.0, 4.6],
        help="mean accepted lengths L, comma-separated (default 3,4.6)",
    )  # fmt: skip
    ap.add_argument(
        "--context", type=int, action="append",
        help="context to report, repeatable (default: every context in the profile)",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, help="write the results here as JSON")
    args = ap.parse_args(argv)
    try:
        profiles = [EngineProfile.read(p) for p in args.profile]
        curves = merge(profiles)
    except (ProfileError, ValueError) as exc:
        print(f"sd_speedup: {exc}", file=sys.stderr)
        return 2
    contexts = args.context or sorted({ctx for (_, ctx, _) in curves.decode})
    results = [analyse(curves, ctx, a) for ctx in contexts for a in args.accepted]
    print(f"profiles: {', '.join(map(str, args.profile))}; device {profiles[0].device}; "
          f"{profiles[0].model.params:,} parameters, {profiles[0].model.dtype}")  # fmt: skip
    print("speedup = L x t_decode / t_sd; * = t_sd from bare forwards (k drafts + verify), "
          "else the measured whole speculative step")  # fmt: skip
    for r in results:
        print()
        print(table(r))
    if not any(r["batches"] for r in results):
        print("sd_speedup: no decode points at the requested context(s)", file=sys.stderr)
        return 2
    if args.out is not None:
        report = {
            "profiles": [str(p) for p in args.profile],
            "device": profiles[0].device,
            "model": profiles[0].to_dict()["model"],
            "formula": "speedup = L * t_decode(B) / t_sd(B, k), depths with k + 1 >= L",
            "notes": [n for p in profiles for n in p.notes],
            "results": results,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
