# The GPU image of the smp_fsdp payload: a SageMaker PyTorch training image (it carries SMP v2,
# torch.sagemaker, and EFA/NCCL) with jobgen's payload and entrypoints. Build from the context
# `jobgen image-context DIR --site SITE` writes: it prints the build, with BASE_IMAGE (SMP v2's
# image in the site's region), the docker login its registry needs, and the arguments below,
# which env/containers/images.yaml declares (image p4d-smp): nothing here repeats them.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
# The torch and Python the base must carry; the pip requirements the image adds (PACKAGES,
# space-separated); the statements the build runs to prove the payload imports (IMPORTS, a JSON
# list) with IMPORT_PATH on sys.path; where jobgen's files go.
ARG BASE_TORCH
ARG BASE_PYTHON
ARG PACKAGES
ARG IMPORTS
ARG IMPORT_PATH
ARG JOBGEN_DIR=/opt/jobgen

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY env/containers/build_check.py /tmp/jobgen-build-check.py
# The base is the one declared, and nothing installed below may replace its torch, numpy or
# SMP's and NVIDIA's own packages (a constraints file of what it has installed).
RUN python3 /tmp/jobgen-build-check.py base \
 && python3 /tmp/jobgen-build-check.py constraints \
      '(torch|torch[-_].*|numpy|triton|nvidia[-_].*|smdistributed[-_].*|sagemaker[-_].*)' \
      > /tmp/keep.txt \
 && read -ra packages <<< "$PACKAGES" \
 && if (( ${#packages[@]} )); then \
      python3 -m pip install --no-cache-dir -c /tmp/keep.txt "${packages[@]}"; \
    fi \
 && rm /tmp/keep.txt

COPY payload/ ${JOBGEN_DIR}/payload/
# The payload's digest, which every job rendered for it names: build from the context that
# `jobgen image-context DIR` writes (a checkout's payload/ has no digest file).
RUN test -s "$JOBGEN_DIR/payload/.jobgen-digest" \
 || { echo 'no payload digest: build from `jobgen image-context DIR`' >&2; exit 1; }
COPY env/containers/sagemaker-entrypoint.sh env/containers/eks-entrypoint.sh ${JOBGEN_DIR}/
# What the payload imports, imported as it runs (transformers with its PyTorch support on).
RUN chmod 0755 "$JOBGEN_DIR"/*.sh \
 && for f in "$JOBGEN_DIR"/*.sh; do bash -n "$f"; done \
 && python3 /tmp/jobgen-build-check.py imports \
 && rm /tmp/jobgen-build-check.py
ENV JOBGEN_DIR=${JOBGEN_DIR}
