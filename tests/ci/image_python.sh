#!/usr/bin/env bash
# An image's Python environment, rehearsed where the package index serves its base's torch for
# its base's Python: a venv of that Python with that torch and the image's declared packages
# (env/containers/images.yaml), installed as the image build installs them, then the build's own
# checks (env/containers/build_check.py): the base's torch and Python, and the declared imports
# with the payload of this checkout on the path the build uses.
#
#   bash tests/ci/image_python.sh VENV [IMAGE]      # IMAGE: p4d-smp (default)
#
# p4d-smp is the image this fits: PyPI serves torch 2.4.1 for CPython 3.11 (its CUDA build, with
# about 2.5 GB of CUDA wheels). Modules that only the base image has (SMP's torch.sagemaker) are
# left out of the imports, and the run says so. Neither CI tier runs it: tests/test_image_pythons.py
# runs it when JOBGEN_TEST_BASE_TORCH=1 (env/containers/README.md, "Python environment").
# Environment: JOBGEN_PYTHON (the Python with jobgen installed; default .venv/bin/python),
# BASE_ONLY (space-separated modules to leave out; default for p4d-smp: torch.sagemaker).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VENV=${1:?usage: image_python.sh VENV [IMAGE]}
IMAGE=${2:-p4d-smp}
JOBGEN_PYTHON=${JOBGEN_PYTHON:-$REPO/.venv/bin/python}
BASE_ONLY=${BASE_ONLY-torch.sagemaker}

# The image's declaration, as the build gets it (image-context's build arguments), with the
# payload folder of the image moved to this checkout's.
declared=$("$JOBGEN_PYTHON" - "$IMAGE" "$REPO/payload" "$BASE_ONLY" <<'EOF'
import json, re, shlex, sys
from jobgen.images import catalog as images
name, payload, base_only = sys.argv[1], sys.argv[2], set(sys.argv[3].split())
image = images.declared().images[name]
args = dict(images.build_args(image, None))
kept, left_out = [], []
for statement in image.imports:
    found = re.fullmatch(r"import ([\w., ]+)", statement)
    if found:
        modules = [m.strip() for m in found.group(1).split(",")]
        left_out += [m for m in modules if m in base_only]
        modules = [m for m in modules if m not in base_only]
        if not modules:
            continue
        statement = "import " + ", ".join(modules)
    kept.append(statement)
for key, value in {"PYTHON_VERSION": image.python, "TORCH": image.torch,
                   "PACKAGES": args["PACKAGES"], "IMPORTS": json.dumps(kept),
                   "IMPORT_PATH": args["IMPORT_PATH"].replace(images.declared().payload_dir,
                                                              payload),
                   "LEFT_OUT": " ".join(left_out)}.items():
    print(f"{key}={shlex.quote(value)}")
EOF
)
eval "$declared"

say() { printf 'image_python[%s]: %s\n' "$IMAGE" "$*"; }
t0=$SECONDS
python=$(command -v "python$PYTHON_VERSION") || { say "no python$PYTHON_VERSION on PATH"; exit 2; }
[[ -x $VENV/bin/python ]] || "$python" -m venv "$VENV"
# shellcheck disable=SC2153  # PACKAGES and the others are set by the eval above
read -ra packages <<< "$PACKAGES"
say "installing torch==$TORCH ${packages[*]} for Python $PYTHON_VERSION"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
    "torch==$TORCH" "${packages[@]}"
say "installed in $((SECONDS - t0)) s"
[[ -z $LEFT_OUT ]] || say "left out (only the base image has them): $LEFT_OUT"
BASE_TORCH=$TORCH BASE_PYTHON=$PYTHON_VERSION "$VENV/bin/python" "$REPO/env/containers/build_check.py" base
IMPORTS=$IMPORTS IMPORT_PATH=$IMPORT_PATH "$VENV/bin/python" "$REPO/env/containers/build_check.py" imports
say "imports passed; $((SECONDS - t0)) s in all"
