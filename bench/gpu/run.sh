#!/usr/bin/env bash
# The GPU session's one command: one of three suites, each within one 9-minute device call.
#
# Run in the repository root of a lent GPU machine (one H100 or H200, PyTorch + Triton +
# transformers, no network), with the wheels of bench/gpu/prepare.sh carried along:
#
#     bash bench/gpu/run.sh --suite rl-build    # call 1 of sitting A: build builtin:small
#     bash bench/gpu/run.sh [--suite rl]        # call 2 of sitting A: both arms, profile, sim
#     bash bench/gpu/run.sh --suite engine      # sitting B
#     bash bench/gpu/run.sh --dry-run-cpu [--suite ...]   # the same stages on CPU, tiny settings
#
# Every result goes under $OUT (default ./gpu-out). With PACK=DIR (the device tool's $OUT, which
# brings back at most 8 files) the suite also packs $OUT into DIR/gpu-<suite>.tgz after every
# stage, and copies summary.json there at the end, so a call cut short still returns what ran.
#
# Sitting A (issue #53) is two calls back to back on one warm machine: suite rl-build (env,
# setup, build: builtin:small and its drafter built on the GPU, ~280 s on an H200) writes the
# builds into $LONGTAIL_CACHE_DIR, by default .gpu-cache/ in the tree (git-ignored: the warm
# machine keeps it for the next call); suite rl (env, setup, rl-step) then finds them cached and
# spends its call on examples/06 for 4 RL steps with and without Longtail, a profile of that
# model and the simulator's prediction of both runs (bench/gpu/rl_step_gpu.py, $OUT/rl-step). On a
# fresh machine suite rl builds first (it still runs whole, with less time for the rest).
# Suite lossless (issue #53, sitting C): env, setup, build, divergence, tests: greedy with and
# without SD on builtin:small in bf16 and float32, the first differing token and the target's
# top-two margin there (bench/gpu/greedy_divergence.py, $OUT/divergence.json), then pytest -m gpu.
# Suite engine (issue #34): env, setup, tests, profile-1.5b, profile-7b, speedup, weight-sync.
# Each stage runs as its own process under `timeout`, logs to $OUT/<stage>.log and appends
# {stage, rc, seconds} to $OUT/stages.jsonl; a failed stage is recorded and the next one still
# runs. The whole suite
# keeps within SUITE_BUDGET_S (default 530 s, under the session's 9-minute command): a stage's
# timeout is its own limit, cut to what the budget leaves after the floors of the stages still
# to come, so an overrun early squeezes later stages instead of the session killing everything.
# At the end $OUT/summary.json gathers the stages and a table is printed.
#
# The profiles run `longtail profile` through bench/gpu/profile_gpu.py, which skips the loopback
# weight-sync measurement (minutes
# for a 7B policy; the simulator gets the roofline's sync figures, labelled as assumed, and
# bench/gpu/weight_sync_gpu.py measures the GPU side), measures every batch size apart (one that
# runs out of memory is dropped and noted instead of losing the profile) and stops adding batch
# sizes near its deadline, so a profile file is written whatever happens.
set -u

usage() {
    sed -n '2,36p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

MODE=${SUITE_MODE:-gpu}  # a stage process inherits the suite's mode
SUITE=rl
STAGE=
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run-cpu) MODE=cpu ;;
        --suite)
            SUITE=${2:-}; shift
            case "$SUITE" in
                rl | rl-build | lossless | engine) ;;
                *) echo "run.sh: --suite ${SUITE:-(none)}: use rl-build, rl, lossless or engine" >&2
                   exit 2 ;;
            esac ;;
        --stage) STAGE=${2:-}; shift ;;  # internal: run one stage's body (under timeout)
        -h | --help) usage; exit 0 ;;
        *) echo "run.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
    esac
    shift
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1

# ---------------------------------------------------------------------------------------------
# Settings (exported once by the top-level call; stage calls inherit them).

if [ -z "$STAGE" ]; then
    export SUITE_MODE=$MODE
    OUT=${OUT:-$ROOT/gpu-out}
    mkdir -p "$OUT" || exit 1
    OUT=$(cd "$OUT" && pwd)
    export OUT
    # Wheels land outside the tree (the tree is a copy that may come back) and outside $OUT.
    SITE=$(mktemp -d "${TMPDIR:-/tmp}/longtail-gpu-site.XXXXXX") || exit 1
    export SITE
    # The interpreter: $PYTHON if set; for the dry run this checkout's .venv; else the first of
    # python3 and python that has torch (the GPU machine's own PyTorch build).
    if [ -z "${PYTHON:-}" ] && [ "$MODE" = cpu ] && [ -x "$ROOT/.venv/bin/python" ]; then
        PYTHON=$ROOT/.venv/bin/python
    fi
    if [ -z "${PYTHON:-}" ]; then
        for candidate in python3 python; do
            if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null; then
                PYTHON=$(command -v "$candidate")
                break
            fi
        done
    fi
    export PYTHON=${PYTHON:-python3}
    # The tree's packages without installing it (pyproject: packages.find where=...). Never put
    # bench/ on the path: bench/operator.py would shadow the standard library's operator.
    PYTHONPATH=$ROOT/api:$ROOT/operator:$ROOT/workers:$ROOT/cli:$ROOT/helm:$SITE${PYTHONPATH:+:$PYTHONPATH}
    export PYTHONPATH
    export PYTHONUNBUFFERED=1
    # No network there: nothing may wait on the Hugging Face hub (the models are built from
    # configs, nothing is downloaded).
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
    # On the GPU machine the builds live in the tree's ignored .gpu-cache/, which a warm machine
    # keeps between calls (its home directory is not promised to); the CPU dry run uses the
    # usual cache, where builtin:tiny already is.
    if [ "$MODE" = gpu ] && [ -z "${LONGTAIL_CACHE_DIR:-}" ]; then
        export LONGTAIL_CACHE_DIR=$ROOT/.gpu-cache
    fi
fi

# ---------------------------------------------------------------------------------------------
# Stage bodies (each runs in its own process: `run.sh --stage NAME`).

stage_env() {
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi || true
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm \
            --format=csv >"$OUT/nvidia-smi.csv" 2>&1 || true
    else
        echo "nvidia-smi: not present"
    fi
    "$PYTHON" - "$OUT/env.json" <<'PY'
"""The machine, as JSON: Python and library versions, the CUDA device."""
import importlib
import json
import platform
import sys

env = {"python": sys.version.split()[0], "platform": platform.platform()}
for name in ("torch", "triton", "transformers", "numpy", "pytest"):
    try:
        env[name] = importlib.import_module(name).__version__
    except Exception as exc:  # noqa: BLE001 - record whatever went wrong, never fail here
        env[name] = f"unavailable: {exc}"
try:
    import torch

    env["cuda_available"] = torch.cuda.is_available()
    env["torch_cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["device_name"] = torch.cuda.get_device_name(0)
        env["device_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["device_sms"] = props.multi_processor_count
        env["device_capability"] = f"{props.major}.{props.minor}"
    else:
        env["device_name"] = None
except Exception as exc:  # noqa: BLE001
    env["torch_error"] = str(exc)
print(json.dumps(env, indent=2))
with open(sys.argv[1], "w") as f:
    json.dump(env, f, indent=2)
PY
}

stage_setup() {
    "$PYTHON" - "$ROOT/bench/gpu/wheels" "$SITE" <<'PY'
"""Make the tree importable offline: install the pure-Python packages it imports that this
machine lacks, from the carried wheels (bench/gpu/prepare.sh), into a directory on PYTHONPATH."""
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

wheels, site = Path(sys.argv[1]), Path(sys.argv[2])
# import name -> distribution: what the GPU tests, the profile and the weight-sync bench import
# beyond torch, triton and transformers (and transformers' own numpy, pyyaml, safetensors).
NEEDED = {
    "pytest": "pytest", "pluggy": "pluggy", "iniconfig": "iniconfig", "pygments": "pygments",
    "packaging": "packaging", "pytest_timeout": "pytest-timeout",
    "prometheus_client": "prometheus-client", "httpx": "httpx", "httpcore": "httpcore",
    "h11": "h11", "anyio": "anyio", "sniffio": "sniffio", "idna": "idna", "certifi": "certifi",
    "starlette": "starlette", "uvicorn": "uvicorn", "click": "click", "tenacity": "tenacity",
    "rich": "rich", "markdown_it": "markdown-it-py", "mdurl": "mdurl",
    "python_multipart": "python-multipart", "typing_extensions": "typing-extensions",
    # reward 'math' (the verifier, the build's eval): math-verify and its parser; sympy comes
    # with torch. Without them every math reward fails (the 2026-12-04 sitting C build log).
    "math_verify": "math-verify", "latex2sympy2_extended": "latex2sympy2_extended",
    "antlr4": "antlr4-python3-runtime",
}
missing = sorted({d for m, d in NEEDED.items() if importlib.util.find_spec(m) is None})
print("missing:", " ".join(missing) or "nothing")
if missing and not wheels.is_dir():
    print(f"no {wheels} (bench/gpu/prepare.sh, carried as bench/gpu/wheels): cannot install")
elif missing:
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet",
           "--find-links", str(wheels), "--target", str(site), *missing]
    print(" ".join(cmd))
    if subprocess.run(cmd).returncode != 0:
        # No pip (or it refused): a pure-Python wheel is a zip of what an install puts down.
        def norm(name: str) -> str:
            return name.lower().replace("-", "_")
        for dist in missing:
            found = [w for w in wheels.glob("*.whl")
                     if norm(w.name.split("-")[0]) == norm(dist) and "none-any" in w.name]
            if found:
                zipfile.ZipFile(sorted(found)[-1]).extractall(site)
                print(f"unzipped {sorted(found)[-1].name}")
            else:
                print(f"no wheel for {dist} in {wheels}")
PY
    # Whatever was installed, the stage passes only if the tree imports.
    "$PYTHON" - <<'PY'
"""Import what the later stages import (a fresh process sees the installed packages)."""
import pytest

import longtail_workers.engine.native.torch_engine
import longtail_workers.profile.main  # noqa: F401
import math_verify  # noqa: F401  # reward 'math' judges every answer with it

print("imports ok; pytest", pytest.__version__)
PY
}

stage_tests() {
    # Only the modules that hold GPU tests: a module elsewhere in tests/unit/workers that cannot
    # be collected on this machine (a library it lacks) must not cost the GPU tests their run.
    local files rc timeout_opt=()
    files=$(grep -l -E 'pytest\.mark\.gpu' tests/unit/workers/test_*.py | tr '\n' ' ')
    echo "modules with GPU tests: $files"
    if "$PYTHON" -c "import pytest_timeout" 2>/dev/null; then timeout_opt=(--timeout=90); fi
    # shellcheck disable=SC2086 # $files is a list of paths without spaces
    "$PYTHON" -m pytest -m gpu -q -rs -p no:cacheprovider ${timeout_opt[@]+"${timeout_opt[@]}"} \
        --junitxml="$OUT/gpu-tests.xml" $files
    rc=$?
    "$PYTHON" - "$OUT/gpu-tests.xml" "$MODE" "$rc" <<'PY'
"""Judge the run: on a GPU, zero executed tests is a failure; on CPU, all skipped is the point."""
import sys
import xml.etree.ElementTree as ET

path, mode, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    suites = ET.parse(path).getroot()
    suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
    total, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
except (OSError, ET.ParseError, AttributeError):
    total = skipped = 0
ran = total - skipped
print(f"gpu tests: {total} collected, {skipped} skipped, {ran} ran; pytest exit {rc}")
if mode == "gpu":
    verdict = rc if rc not in (0, 5) else (1 if ran == 0 else 0)
    if ran == 0:
        print("FAIL: no GPU test ran on the GPU machine")
else:  # CPU dry run: 5 = nothing selected/ran, 0 = all skipped
    verdict = 0 if rc in (0, 5) and ran == 0 else rc
sys.exit(verdict)
PY
}


profile_args() {  # NAME -> the arguments of `longtail profile` for that stage and mode
    if [ "$MODE" = cpu ]; then
        echo "--shape micro --device cpu --dtype float32 --threads 2 --quick --batches 1,2" \
            "--contexts 32 --depths 2 --repeats 1 --warmup 0"
    elif [ "$1" = profile-1.5b ]; then
        echo "--shape qwen2-1.5b --device cuda --dtype bfloat16" \
            "--batches 1,2,4,8,16,32,64,128,256 --contexts 2048 --depths 3,4,5" \
            "--repeats 3 --warmup 1"
    else
        echo "--shape qwen2-7b --device cuda --dtype bfloat16 --batches 1,8,32,128" \
            "--contexts 2048 --depths 3,4,5 --repeats 2 --warmup 1"
    fi
}

stage_profile() {  # NAME OUTFILE TAIL_S: TAIL_S = time kept after the curves' deadline
    local name=$1 out=$2 tail=$3 deadline
    deadline=$(( ${STAGE_TIMEOUT_S:-600} - tail ))
    (( deadline < 10 )) && deadline=10
    # shellcheck disable=SC2046 # profile_args prints words without spaces inside them
    "$PYTHON" bench/gpu/profile_gpu.py "$deadline" $(profile_args "$name") --out "$out"
}

stage_speedup() {
    local rc
    "$PYTHON" bench/gpu/sd_speedup.py --profile "$OUT/profile-qwen2-1.5b.json" \
        --accepted 3,4.6 --out "$OUT/sd_speedup.json"
    rc=$?
    if [ -f "$OUT/profile-qwen2-7b.json" ]; then  # a bonus: its failure does not fail the stage
        echo
        "$PYTHON" bench/gpu/sd_speedup.py --profile "$OUT/profile-qwen2-7b.json" \
            --accepted 3,4.6 --out "$OUT/sd_speedup-7b.json" || echo "(7B speedup failed)"
    fi
    return "$rc"
}

stage_weight_sync() {
    if [ "$MODE" = cpu ]; then
        "$PYTHON" bench/gpu/weight_sync_gpu.py --device cpu --shape 0.5B --repeat 1 \
            --bucket-mb 256 --out "$OUT/weight_sync_gpu.json"
    else
        "$PYTHON" bench/gpu/weight_sync_gpu.py --out "$OUT/weight_sync_gpu.json"
    fi
}

stage_rl_step() {  # [--build-only]
    if [ "$MODE" = cpu ]; then  # the plumbing on builtin:tiny: one step an arm, a quick profile
        "$PYTHON" bench/gpu/rl_step_gpu.py --out "$OUT/rl-step" --job examples/01-tiny-arith.yaml \
            --steps 1 --eval-size 4 --profile-args "--device cpu --quick --threads 1 --batches 1,2 \
            --contexts 16 --depths 2" "$@"
    else
        # shellcheck disable=SC2086  # RL_STEP_ARGS: a shorter run for a session short of time
        "$PYTHON" bench/gpu/rl_step_gpu.py --out "$OUT/rl-step" \
            ${RL_STEP_ARGS:---steps 4 --eval-size 4 --profile-deadline 30} "$@"
    fi
}

stage_divergence() {
    if [ "$MODE" = cpu ]; then
        "$PYTHON" bench/gpu/greedy_divergence.py --job examples/01-tiny-arith.yaml --items 4 \
            --device cpu --max-new-tokens 64 --out "$OUT/divergence.json"
    else
        "$PYTHON" bench/gpu/greedy_divergence.py --job examples/06-small-arith-gpu.yaml \
            --items 4 --device cuda --out "$OUT/divergence.json"
    fi
}

if [ -n "$STAGE" ]; then
    case "$STAGE" in
        env) stage_env ;;
        rl-step) stage_rl_step ;;
        build) stage_rl_step --build-only ;;
        divergence) stage_divergence ;;
        setup) stage_setup ;;
        tests) stage_tests ;;
        profile-1.5b) stage_profile profile-1.5b "$OUT/profile-qwen2-1.5b.json" 60 ;;
        profile-7b) stage_profile profile-7b "$OUT/profile-qwen2-7b.json" 75 ;;
        speedup) stage_speedup ;;
        weight-sync) stage_weight_sync ;;
        *) echo "run.sh: unknown stage $STAGE" >&2; exit 2 ;;
    esac
    exit $?
fi

# ---------------------------------------------------------------------------------------------
# The suite.

# On CPU the dry run's tiny stages still take longer than on a GPU: every limit is scaled.
SCALE=1
[ "$MODE" = cpu ] && SCALE=3
BUDGET_S=${SUITE_BUDGET_S:-$(( 530 * SCALE ))}
START=$(date +%s)
: >"$OUT/stages.jsonl"
NAMES=() RCS=() SECS=() LIMITS=()

run_stage() {  # NAME LIMIT_S FLOOR_OF_LATER_STAGES_S
    # A budget cut below the default (SUITE_BUDGET_S) cuts the floors in proportion, so the
    # first stages still run (a floor of 400 s in a 395 s budget would skip them).
    local name=$1 limit=$(( $2 * SCALE )) reserve=$(( $3 * BUDGET_S / 530 )) left t t0 rc status secs
    left=$(( BUDGET_S - ($(date +%s) - START) - reserve ))
    t=$(( limit < left ? limit : left ))
    t0=$(date +%s.%N)
    if (( t < 5 )); then
        rc=null status=skipped t=0
        echo "skipped: no time left in the suite budget" >"$OUT/$name.log"
    else
        echo "== $name (timeout ${t}s) -> $OUT/$name.log"
        STAGE_TIMEOUT_S=$t timeout -k 10 "$t" bash "${BASH_SOURCE[0]}" --stage "$name" \
            >"$OUT/$name.log" 2>&1 </dev/null
        rc=$?
        case "$rc" in
            0) status=ok ;;
            124 | 137) status=timeout ;;
            *) status=failed ;;
        esac
    fi
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    printf '{"stage": "%s", "rc": %s, "status": "%s", "seconds": %s, "timeout_s": %s}\n' \
        "$name" "$rc" "$status" "$secs" "$t" >>"$OUT/stages.jsonl"
    NAMES+=("$name") RCS+=("$rc ($status)") SECS+=("$secs") LIMITS+=("$t")
    tail -n 3 "$OUT/$name.log" | sed 's/^/   | /'
    pack
}

pack() {  # $OUT as one file in $PACK (the device tool brings back at most 8 files)
    if [ -n "${PACK:-}" ]; then
        mkdir -p "$PACK" && tar czf "$PACK/gpu-$SUITE.tgz.part" -C "$OUT" . \
            && mv "$PACK/gpu-$SUITE.tgz.part" "$PACK/gpu-$SUITE.tgz" || echo "(pack failed)"
    fi
}

echo "GPU suite $SUITE ($MODE mode): OUT=$OUT, python $PYTHON, budget ${BUDGET_S}s"
# Limits, and the floor each stage leaves for the ones after it (the sum of their floors).
if [ "$SUITE" = rl-build ]; then  # floors: setup 20, build 300
    run_stage env 30 320
    run_stage setup 60 300
    run_stage build 480 0
elif [ "$SUITE" = lossless ]; then  # floors: setup 20, build 280, divergence 90, tests 30
    run_stage env 30 420
    run_stage setup 60 400
    run_stage build 360 120
    run_stage divergence 200 30
    run_stage tests 120 0
elif [ "$SUITE" = rl ]; then  # floors: setup 20, rl-step 380
    run_stage env 30 400
    run_stage setup 60 380
    run_stage rl-step 500 0
else  # floors: tests 60, profile-1.5b 120, profile-7b 90, speedup 10, weight-sync 45
    run_stage env 30 345
    run_stage setup 60 325
    run_stage tests 120 265
    run_stage profile-1.5b 230 145
    run_stage profile-7b 150 55
    run_stage speedup 20 45
    run_stage weight-sync 60 0
fi

"$PYTHON" - "$OUT" "$MODE" "$BUDGET_S" "$SUITE" <<'PY' || echo "(summary.json not written)"
"""Gather stages.jsonl (and env.json) into summary.json."""
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
stages = [json.loads(line) for line in (out / "stages.jsonl").read_text().splitlines() if line]
env = out / "env.json"
summary = {
    "suite": sys.argv[4],
    "mode": sys.argv[2],
    "budget_s": float(sys.argv[3]),
    "total_s": round(sum(s["seconds"] for s in stages), 1),
    "env": json.loads(env.read_text()) if env.exists() else None,
    "stages": stages,
    "files": sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()),
}
rl = out / "rl-step" / "rl_step.json"
if rl.exists():  # sitting A's headline figures, on the summary screen
    r = json.loads(rl.read_text())
    keys = ("step_time_ratio", "step_time_ratio_from_2", "rollout_time_ratio",
            "rollout_time_ratio_from_2", "eval_step0")
    summary["rl_step"] = {k: r.get(k) for k in keys}
    for k in keys:
        print(f"{k:>26}: {r.get(k)}")
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
PY

echo
printf '%-14s %-16s %9s %9s\n' stage rc seconds timeout
for i in "${!NAMES[@]}"; do
    printf '%-14s %-16s %9s %9s\n' "${NAMES[$i]}" "${RCS[$i]}" "${SECS[$i]}" "${LIMITS[$i]}"
done
printf 'total %ss of %ss budget; results in %s\n' "$(( $(date +%s) - START ))" "$BUDGET_S" "$OUT"
pack
[ -n "${PACK:-}" ] && [ -f "$OUT/summary.json" ] && cp "$OUT/summary.json" "$PACK/summary-$SUITE.json"
rm -rf "$SITE"
