# jobgen's AWS Batch image for dl1.24xlarge (8 first-generation Gaudi, 4 EFA): the DeepSpeed BERT
# payload (payload/habana_deepspeed). Build from the context `jobgen image-context DIR` writes
# (it prints this command with the payload id as the tag):
#
#   docker build -f DIR/env/containers/habana.Dockerfile -t jobgen-habana:<payload id> DIR
#
# Unverified here (no Docker daemon or registry on the machine this was written on): see
# env/containers/README.md. Every version below is a build argument.

# Intel Gaudi PyTorch image. dl1 has first-generation Gaudi: keep to a software release whose
# support matrix still lists it (1.16 does), and to the same release on the hosts' driver.
ARG GAUDI_VERSION=1.16.0
ARG GAUDI_OS=ubuntu22.04
ARG GAUDI_PYTORCH=2.2.2
ARG BASE_IMAGE=vault.habana.ai/gaudi-docker/${GAUDI_VERSION}/${GAUDI_OS}/habanalabs/pytorch-installer-${GAUDI_PYTORCH}:latest
FROM ${BASE_IMAGE}

# The torch and Python the base must carry; the pip requirements the image adds (PACKAGES,
# space-separated: Habana's DeepSpeed fork at the base's release, what the payload imports); the
# statements the build runs to prove the payload imports (IMPORTS, a JSON list) with IMPORT_PATH
# on sys.path. env/containers/images.yaml declares them (image dl1-deepspeed) and `jobgen
# image-context` passes them: nothing here repeats them.
ARG BASE_TORCH
ARG BASE_PYTHON
ARG PACKAGES
ARG IMPORTS
ARG IMPORT_PATH
# Where jobgen's files go (env/containers/images.yaml; `jobgen image-context` passes it).
ARG JOBGEN_DIR=/opt/jobgen

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The entrypoint needs bash, python3, ip (iproute2), hostname, setsid (util-linux), awk.
RUN apt-get update \
 && apt-get install -y --no-install-recommends iproute2 util-linux gawk git ca-certificates \
 && rm -rf /var/lib/apt/lists/*

# Fabric: the base's own, nothing installed here. Habana's base image of this release
# (HabanaAI/Setup_and_Install, tag 1.16.0, dockerfiles/base/Dockerfile.ubuntu22.04) builds
# libfabric 1.20.0 with --with-synapseai into LIBFABRIC_ROOT=/opt/habanalabs/libfabric-1.20.0,
# puts $LIBFABRIC_ROOT/lib first on LD_LIBRARY_PATH and $LIBFABRIC_ROOT/bin on PATH, builds
# HabanaAI/hccl_ofi_wrapper against it into /usr/lib/habanalabs/libhccl_ofi_wrapper.so, and
# removes the ld.so.conf entry of the EFA installer's own libfabric (/opt/amazon/efa). Habana's
# documentation says the same of its containers ("OFI Wrapper and libFabric are already
# installed"). Another libfabric first on the library path (this image used to run the EFA
# installer and build the wrapper from an unpinned main) is one HCCL_OVER_OFI=1 loads without
# SynapseAI support. So the build checks that the wrapper is there and that the libfabric it
# loads is the base's: the release LIBFABRIC_VERSION names, under LIBFABRIC_ROOT. That build's
# SynapseAI support is taken from the base's Dockerfile, not probed: whether the library reaches
# Gaudi memory over EFA shows only on dl1 hosts (fi_info -p efa needs the devices).
# (`fi_info --version` prints the version of the libfabric it loaded: libfabric's util/info.c.)
RUN set -eu; \
    root=${LIBFABRIC_ROOT:?the base image sets no LIBFABRIC_ROOT: not Habana base image}; \
    wrapper=/usr/lib/habanalabs/libhccl_ofi_wrapper.so; \
    if [ ! -f "$wrapper" ]; then echo "no $wrapper in the base image" >&2; exit 1; fi; \
    loaded=$(ldd "$wrapper" | awk '$1 == "libfabric.so.1" && $3 ~ /^\// { print $3 }'); \
    echo "HCCL's OFI wrapper $wrapper loads libfabric from ${loaded:-nowhere}"; \
    case "$(readlink -f "${loaded:-/none}")" in \
      "$(readlink -f "$root")"/lib/*) ;; \
      *) echo "the OFI wrapper loads ${loaded:-no libfabric}, not the base's under $root" >&2; exit 1 ;; \
    esac; \
    version=$(fi_info --version | awk -F': ' '$1 == "libfabric" { print $2 }'); \
    if [ "$version" != "${LIBFABRIC_VERSION:?}" ]; then \
      echo "fi_info loads libfabric ${version:-?}, not the base's $LIBFABRIC_VERSION" >&2; exit 1; \
    fi

COPY env/containers/build_check.py /tmp/jobgen-build-check.py
# The base is the one declared, and nothing installed below may replace its torch (Habana's
# build), numpy or Habana's own packages (a constraints file of what it has installed).
RUN python3 /tmp/jobgen-build-check.py base \
 && python3 /tmp/jobgen-build-check.py constraints '(torch|torch[-_].*|numpy|habana[-_].*|lightning[-_]habana)' \
      > /tmp/keep.txt \
 && read -ra packages <<< "$PACKAGES" \
 && if (( ${#packages[@]} )); then python3 -m pip install -c /tmp/keep.txt "${packages[@]}"; fi \
 && rm /tmp/keep.txt

# jobgen: the payload and the entrypoint the job definition's command names.
COPY payload/ ${JOBGEN_DIR}/payload/
# The payload's digest, which every job rendered for it names: build from the context that
# `jobgen image-context DIR` writes (a checkout's payload/ has no digest file).
RUN test -s "$JOBGEN_DIR/payload/.jobgen-digest" \
 || { echo 'no payload digest: build from `jobgen image-context DIR`' >&2; exit 1; }
# The entrypoints of Batch, SageMaker training jobs and EKS pods: the same image runs on each.
COPY env/containers/entrypoint.sh env/containers/sagemaker-entrypoint.sh \
     env/containers/eks-entrypoint.sh ${JOBGEN_DIR}/
# What the payload imports, imported as it runs (Habana's torch and DeepSpeed, transformers
# with its PyTorch support on), and the node's file writer.
RUN chmod 0755 "$JOBGEN_DIR"/*.sh \
 && for f in "$JOBGEN_DIR"/*.sh; do bash -n "$f"; done \
 && python3 -m py_compile "$JOBGEN_DIR/payload/common/batch_setup.py" \
 && python3 /tmp/jobgen-build-check.py imports \
 && rm /tmp/jobgen-build-check.py
ENV JOBGEN_DIR=${JOBGEN_DIR}

# Relative site paths (the `local` site's jobgen-runs/...) are taken from here.
WORKDIR /workspace
# CMD, not ENTRYPOINT: the Batch job definition's command names the entrypoint and its arguments.
CMD ["/bin/bash", "-c", "exec \"$JOBGEN_DIR/entrypoint.sh\""]
