"""Write or drift-check the generated CRD files (``make crds`` / ``make verify``).

Usage: ``python -m longtail_api.crdgen (--write | --check) FILE...``. Every FILE receives the
same text, :func:`longtail_api.schema.render_crd`; ``--check`` exits 1 naming each file that
differs from what the dataclasses generate, with the first differing lines.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from longtail_api.schema import render_crd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m longtail_api.crdgen", description=__doc__)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="(re)generate the files")
    mode.add_argument("--check", action="store_true", help="fail if a file differs")
    ap.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args(argv)
    want = render_crd()
    drifted = 0
    for path in args.files:
        if args.write:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(want, encoding="utf-8")
            print(f"wrote {path}")
            continue
        have = path.read_text(encoding="utf-8") if path.exists() else ""
        if have != want:
            drifted += 1
            diff = difflib.unified_diff(
                have.splitlines(),
                want.splitlines(),
                f"{path} (committed)",
                f"{path} (generated)",
                lineterm="",
                n=1,
            )
            print(f"DRIFT: {path} differs from the generated CRD. Run `make crds` and commit.")
            print("\n".join(list(diff)[:40]), file=sys.stderr)
    if args.check and not drifted:
        print(f"ok: {len(args.files)} CRD file(s) match the generated schema")
    return 1 if drifted else 0


if __name__ == "__main__":
    sys.exit(main())
