#!/usr/bin/env bash
# THE test command of jobgen (`.ci/run` calls exactly this). On a fresh Debian 12 machine, as root:
#
#   1. apt       the system packages the venv build needs (Python venv/headers, g++) if missing
#   2. venv      $VENV (default .venv): torch (pinned CPU wheel), DeepSpeed with its CPU shm op
#                prebuilt (so no test JIT-compiles it), transformers, h5py, and `-e .[test]`;
#                reused when its stamp matches (hash of setup.cfg & co. and of the install steps)
#   3. lint      ruff, mypy and shellcheck; a failure fails the run, but the tests still run
#   4. services  a local Slurm cluster (slurm-up.sh: 4 nodes in partition debug, 2 in partition
#                side) and moto's server (moto-up.sh)
#   5. pytest    `python -m pytest -q` plus this script's arguments (none: side by side, the
#                Slurm tests one at a time, the moto tests one at a time, and the others on
#                every core), with JOBGEN_TEST_SLURM=1,
#                JOBGEN_TEST_MOTO_URL and JOBGEN_REQUIRE_ALL=1 (missing components fail, not skip)
#   6. teardown  always (trap on EXIT): moto and Slurm are stopped
#
#   bash tests/ci/run.sh [pytest args...]
#   bash tests/ci/run.sh --fast [pytest args...]   # the fast tier: steps 1-3 and the tests that
#                need no service and are not marked slow/slurm/moto/deepspeed (under 3 minutes)
#
# Environment: VENV (venv path, relative to the repo root or absolute), PYTHON (interpreter the
# venv is made from; default python3), VENV_REBUILD=1 (delete and recreate the venv), MOTO_PORT
# (default 5055), SLURM_CI_DIR (see slurm-up.sh).
# Exit status: pytest's (5, "no tests collected", is a failure too); 1 if only the lint failed.
set -euo pipefail

# The whole script is one { ... } block: bash parses it completely before running any of it, so
# editing this file while a (long) run is going cannot make that run execute garbled lines.
{
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
cd "$REPO"

TORCH_VERSION=2.13.0
DEEPSPEED_SPEC=${DEEPSPEED_SPEC:-deepspeed}     # a requirement string, e.g. deepspeed==0.19.8
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
[[ $VENV == /* ]] || VENV=$REPO/$VENV
export MOTO_PORT=${MOTO_PORT:-5055}
export SLURM_CI_DIR=${SLURM_CI_DIR:-/var/tmp/jobgen-slurm}
export DEBIAN_FRONTEND=noninteractive
export PIP_PROGRESS_BAR=off PIP_DISABLE_PIP_VERSION_CHECK=1

FAST=0
if [[ ${1:-} == --fast ]]; then FAST=1; shift; fi

T_START=$EPOCHREALTIME
PHASE=""
PHASE_T0=""
TIMINGS=()
LINT_RC=0
SERVICES_TOUCHED=0
BACKGROUND=()   # pytest runs started beside the foreground one: stopped if the script ends first
TEMPS=()        # their logs: removed however the script ends

say() { printf '\n[run] ===== %s =====\n' "$*"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
phase() {
    end_phase
    PHASE=$1
    PHASE_T0=$EPOCHREALTIME
    say "$1"
}
end_phase() {
    if [[ -n $PHASE ]]; then TIMINGS+=("$(printf '%-10s %7s s' "$PHASE" "$(since "$PHASE_T0")")"); fi
    PHASE=""
}

# shellcheck disable=SC2329  # invoked through the EXIT trap
on_exit() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    # The phase that was running when we got here did not finish.
    [[ -n $PHASE ]] && PHASE="$PHASE(!)"
    local pid
    # Each run leads a process group of its own (setsid): its xdist workers and the commands
    # its tests started stop with it.
    for pid in "${BACKGROUND[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null; done
    for pid in "${BACKGROUND[@]}"; do wait "$pid" 2>/dev/null; done
    ((${#TEMPS[@]})) && rm -f "${TEMPS[@]}"
    if ((SERVICES_TOUCHED)); then
        phase teardown
        local what
        for what in moto slurm; do
            if ! bash "$HERE/$what-down.sh"; then
                echo "[run] ERROR: $what-down.sh failed: daemons may be left running" >&2
                ((rc)) || rc=1
            fi
        done
    fi
    end_phase
    printf '\n[run] ===== timing =====\n'
    ((${#TIMINGS[@]})) && printf '[run] %s\n' "${TIMINGS[@]}"
    printf '[run] %-10s %7s s\n' total "$(since "$T_START")"
    exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

[[ $EUID -eq 0 ]] || { echo "[run] ERROR: run as root (installs packages, starts Slurm daemons)" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------
phase apt
# ---------------------------------------------------------------------------------------------
pkgs=()
if ! command -v "$PYTHON" >/dev/null; then
    pkgs+=(python3 python3-venv python3-dev)
else
    "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || pkgs+=(python3-venv)
    # Python.h: DeepSpeed's shm op is compiled against it at install time.
    "$PYTHON" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' ||
        pkgs+=(python3-dev)
fi
command -v g++ >/dev/null || pkgs+=(g++)
if ((${#pkgs[@]})); then
    echo "[run] installing: ${pkgs[*]}"
    apt-get update -qq </dev/null
    apt-get install -y -qq --no-install-recommends "${pkgs[@]}" </dev/null
else
    echo "[run] nothing to install ($("$PYTHON" -V), $(g++ --version | head -n 1))"
fi

# ---------------------------------------------------------------------------------------------
phase venv
# ---------------------------------------------------------------------------------------------
vpy=$VENV/bin/python
# shellcheck disable=SC2329  # called through timed
vpip() { "$vpy" -m pip "$@"; }

# ds_ok: DeepSpeed is installed, matches DEEPSPEED_SPEC and has the CPU shm op prebuilt.
ds_ok() {
    DS_ACCELERATOR=cpu "$vpy" - "$DEEPSPEED_SPEC" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
from packaging.requirements import Requirement
assert Requirement(sys.argv[1]).specifier.contains(version("deepspeed"), prereleases=True)
from deepspeed.git_version_info import installed_ops
assert installed_ops.get("deepspeed_shm_comm"), installed_ops
EOF
}

# timed LABEL CMD...: run CMD and print how long it took.
timed() {
    local label=$1 t0=$EPOCHREALTIME
    shift
    "$@"
    printf '[run] venv: %-40s %6s s\n' "$label" "$(since "$t0")"
}

# The install steps. Their text is part of the venv's stamp: editing them triggers a re-run.
venv_install() {
    # Never let a dependency replace the pinned CPU torch (it would pull GBs of CUDA wheels).
    printf 'torch==%s\n' "$TORCH_VERSION" >"$VENV/jobgen-constraints.txt"
    export PIP_CONSTRAINT=$VENV/jobgen-constraints.txt
    timed "torch==$TORCH_VERSION setuptools wheel ninja" \
        vpip install -q "torch==$TORCH_VERSION" setuptools wheel ninja
    timed "deepspeed's dependencies" \
        vpip install -q hjson msgpack numpy psutil py-cpuinfo pydantic einops tqdm packaging
    local ds_pid="" ds_wheels=""
    if ds_ok; then
        echo "[run] venv: DeepSpeed with the prebuilt shm op is already installed"
    else
        # Build DeepSpeed's CPU shm-comm op now (about 3 min) rather than JIT at each test run,
        # as a wheel in the background while the rest installs (nothing below needs DeepSpeed).
        # --no-build-isolation: the build sees our torch (an isolated build would fetch another);
        # --no-cache-dir: don't reuse a cached wheel built without the op.
        ds_wheels=$(mktemp -d /tmp/jobgen-ci-deepspeed.XXXXXX)
        DS_ACCELERATOR=cpu DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 timed "$DEEPSPEED_SPEC (building the shm op)" \
            vpip wheel -q --no-build-isolation --no-cache-dir --no-deps -w "$ds_wheels" "$DEEPSPEED_SPEC" &
        ds_pid=$!
    fi
    timed "transformers h5py" vpip install -q transformers h5py
    timed "-e .[test]" vpip install -q -e '.[test]'
    if [[ -n $ds_pid ]]; then
        wait "$ds_pid" || { echo "[run] ERROR: DeepSpeed's wheel did not build" >&2; return 1; }
        # --force-reinstall: replace a DeepSpeed without the op if one is installed.
        timed "deepspeed (the wheel built above)" \
            vpip install -q --no-deps --force-reinstall "$ds_wheels"/deepspeed-*.whl
        rm -rf "$ds_wheels"
        ds_ok || { echo "[run] ERROR: DeepSpeed's shm op is not prebuilt" >&2; return 1; }
    fi
    unset PIP_CONSTRAINT
    # torch 1.13.1's own torchrun parser (neuronx-nemo-megatron's pin), which
    # tests/test_upstream_torchrun.py runs: the smallest 1.13.1 wheel on PyPI (macOS arm64,
    # 53 MB) is downloaded, never installed; the test reads two source files out of it.
    timed "torch 1.13.1 wheel (torchrun's parser)" \
        vpip download -q --no-deps --only-binary=:all: --python-version 3.10 \
        --platform macosx_11_0_arm64 -d "$VENV/upstream" torch==1.13.1
    # ... and torch 2.1.2's (the Neuron SDK 2.20 training image's torch), the same way.
    timed "torch 2.1.2 wheel (torchrun's parser)" \
        vpip download -q --no-deps --only-binary=:all: --python-version 3.10 \
        --platform macosx_11_0_arm64 -d "$VENV/upstream" torch==2.1.2
}

fingerprint() {
    {
        cat setup.cfg setup.py pyproject.toml 2>/dev/null
        declare -f venv_install ds_ok timed
        echo "$TORCH_VERSION $DEEPSPEED_SPEC $VENV"
        "$PYTHON" -c 'import sys; print(sys.version)'
    } | sha256sum | cut -d' ' -f1
}

STAMP=$VENV/.jobgen-ci-stamp
want=$(fingerprint)
venv_python_ok() {
    [[ -x $vpy ]] && [[ "$("$vpy" -c 'import sys; print(sys.version)' 2>/dev/null)" == \
        "$("$PYTHON" -c 'import sys; print(sys.version)')" ]]
}
if [[ ${VENV_REBUILD:-0} == 1 ]] || { [[ -e $VENV ]] && ! venv_python_ok; }; then
    # Only delete something that is a venv.
    if [[ -e $VENV && ! -e $VENV/pyvenv.cfg ]]; then
        echo "[run] ERROR: $VENV exists and is not a virtualenv; not touching it" >&2
        exit 1
    fi
    echo "[run] recreating $VENV"
    rm -rf "$VENV"
fi
if [[ -f $STAMP && $(cat "$STAMP") == "$want" ]] && venv_python_ok; then
    echo "[run] reusing $VENV (stamp matches)"
else
    [[ -x $vpy ]] || "$PYTHON" -m venv "$VENV"
    rm -f "$STAMP"
    echo "[run] installing into $VENV"
    venv_install
    echo "$want" >"$STAMP"
fi
"$vpy" -c "import torch; assert torch.__version__.startswith('$TORCH_VERSION'), torch.__version__"
"$vpy" - <<'EOF'
from importlib.metadata import version
print("[run] " + ", ".join(f"{p} {version(p)}" for p in (
    "torch", "deepspeed", "transformers", "boto3", "moto", "submitit", "pytest", "ruff", "mypy")))
EOF

export VIRTUAL_ENV=$VENV
export PATH=$VENV/bin:$PATH

# ---------------------------------------------------------------------------------------------
phase lint
# ---------------------------------------------------------------------------------------------
lint() {
    local name=$1
    shift
    if "$@"; then
        echo "[run] lint: $name OK"
    else
        echo "[run] lint: $name FAILED"
        LINT_RC=1
    fi
}
lint ruff ruff check --output-format=concise jobgen payload tests benchmarks
lint mypy mypy
lint shellcheck shellcheck -S warning tests/ci/*.sh .ci/run
lint import-circles python benchmarks/import_graph.py --all
if ((LINT_RC)); then echo "[run] LINT FAILED (the run will fail; running the tests anyway)"; fi

rc=0
# The tests that need no service and are quick: the fast tier, and the first part of a full run.
FAST_TIER="not slurm and not moto and not deepspeed and not slow"
if ((FAST)); then
    # -------------------------------------------------------------------------------------------
    phase pytest-fast
    # -------------------------------------------------------------------------------------------
    # One worker per core (pytest-xdist): its tests share no service, port or state folder.
    python -m pytest -q -n "$(nproc)" -m "$FAST_TIER" "$@" || rc=$?
else
    # -------------------------------------------------------------------------------------------
    phase services
    # -------------------------------------------------------------------------------------------
    SERVICES_TOUCHED=1
    NODES=4 SIDE=2 bash "$HERE/slurm-up.sh"
    VENV=$VENV bash "$HERE/moto-up.sh"

    # -------------------------------------------------------------------------------------------
    phase pytest
    # -------------------------------------------------------------------------------------------
    export JOBGEN_TEST_SLURM=1
    export JOBGEN_TEST_MOTO_URL=http://127.0.0.1:$MOTO_PORT
    export JOBGEN_REQUIRE_ALL=1
    if (($#)); then
        python -m pytest -q "$@" || rc=$?
    else
        # The whole suite in three runs side by side: the Slurm tests one at a time (they share
        # the cluster's nodes; much of their time is spent waiting on Slurm); the moto tests one
        # at a time (they share the endpoint's state); and the tests that use neither (the fast
        # tier, DeepSpeed and the other slow rehearsals, each on ports of its own) on every core
        # with pytest-xdist. The last two print their output once they end. All must pass.
        # The two cores are busy until the last minutes: only less work shortens the run (a
        # fourth run beside these, for the time-limit test that mostly sleeps, made it no
        # shorter: the rest slowed down as much).
        part1_log=$(mktemp /tmp/jobgen-ci-part1.XXXXXX)
        moto_log=$(mktemp /tmp/jobgen-ci-moto.XXXXXX)
        TEMPS+=("$part1_log" "$moto_log")
        setsid python -m pytest -q -n "$(nproc)" --durations=15 -m "not slurm and not moto" \
            >"$part1_log" 2>&1 &
        part1=$!
        setsid python -m pytest -q --durations=10 -m "moto and not slurm" >"$moto_log" 2>&1 &
        moto=$!
        # The Slurm run too is waited for, not run in the foreground: a signal to this script
        # then runs its trap at once (bash holds traps until a foreground command ends).
        setsid python -m pytest -q --durations=20 -m "slurm" &
        slurm=$!
        BACKGROUND+=("$part1" "$moto" "$slurm")
        wait "$slurm" || rc=$?
        wait "$moto" || { later=$?; ((rc)) || rc=$later; }
        wait "$part1" || { later=$?; ((rc)) || rc=$later; }
        BACKGROUND=()
        printf '\n[run] ----- the moto tests (run beside the above) -----\n'
        cat "$moto_log"
        printf '\n[run] ----- the tests that use neither Slurm nor moto (run beside the above) -----\n'
        cat "$part1_log"
    fi
fi
end_phase

case $rc in
    0) echo "[run] pytest: passed" ;;
    5) echo "[run] pytest: NO TESTS COLLECTED (exit 5) - counted as a failure" ;;
    *) echo "[run] pytest: FAILED (exit $rc)" ;;
esac
if ((rc == 0 && LINT_RC)); then
    echo "[run] lint failed: see the lint phase above"
    rc=1
fi
exit "$rc"
}
