# jobgen's AWS Batch image for trn1.32xlarge (16 Trainium, 8 EFA): the NeMo payload
# (payload/neuron_nemo: GPT-NeoX 20B, Pythia 6.9B) and the NeuronX Distributed payload
# (payload/neuronx_distributed: Llama 2 7B). Build from the context `jobgen image-context DIR` writes
# (it prints this command with the payload id as the tag):
#
#   docker build -f DIR/env/containers/neuron.Dockerfile -t jobgen-neuron:<payload id> DIR
#
# Unverified here (no Docker daemon or registry on the machine this was written on): see
# env/containers/README.md. Every version below is a build argument.

# AWS Deep Learning Container for Neuron training (torch-neuronx, neuronx-cc, neuronx_distributed,
# EFA libfabric and aws-ofi-nccl are in it). The same image is in the regional DLC registries
# (763104351884.dkr.ecr.<region>.amazonaws.com/pytorch-training-neuronx:<tag>, after an ECR login).
#
# One Neuron SDK release for everything (2.20.2), in two variants, because the two trainers need
# different torch versions (the SDK 2.20.2 DLC exists for both):
#   TRAINER=nxd  (default) the Llama program: the SDK 2.20.2 image with torch 2.1.2, plus the NxD
#                example at its SDK 2.20 release commit (4f95471; later examples import modules
#                that first appear in NxD 2.23, which this image does not have).
#   TRAINER=nemo neuronx-nemo-megatron at its SDK 2.20 release commit (d22aabf), whose Dockerfile
#                installs torch 1.13.1 (and a later commit pins it in build.sh): build it on the
#                SDK 2.20.2 image with torch 1.13.1,
#                  --build-arg TRAINER=nemo
#                  --build-arg BASE_IMAGE=public.ecr.aws/neuron/pytorch-training-neuronx:1.13.1-neuronx-py310-sdk2.20.2-ubuntu20.04
#                (`jobgen image-context` passes both; the build stops if the base image's torch
#                or Python is not the one env/containers/images.yaml declares).
# These pins are the releases jobgen/payloads/upstream/*.json were read from.
ARG BASE_IMAGE=public.ecr.aws/neuron/pytorch-training-neuronx:2.1.2-neuronx-py310-sdk2.20.2-ubuntu20.04
FROM ${BASE_IMAGE}

ARG TRAINER=nxd
ARG NEMO_REPO=https://github.com/aws-neuron/neuronx-nemo-megatron.git
ARG NEMO_REF=d22aabf
ARG NXD_REPO=https://github.com/aws-neuron/neuronx-distributed.git
ARG NXD_REF=4f95471
# Where things go inside the image: env/containers/images.yaml declares these paths, `jobgen
# image-context` passes them, and tests/test_images.py holds these defaults to them.
ARG NEMO_CHECKOUT=/workspace/neuronx-nemo-megatron
ARG NXD_CHECKOUT=/workspace/neuronx-distributed
ARG JOBGEN_DIR=/opt/jobgen
# The torch and Python the base must carry; the pip requirements jobgen adds to the trainer's
# own (PACKAGES, space-separated); the statements the build runs to prove the trainer and the
# payload import (IMPORTS, a JSON list) with IMPORT_PATH on sys.path. images.yaml declares them
# per image (trn1-nemo, trn1-nxd) and `jobgen image-context` passes them.
ARG BASE_TORCH
ARG BASE_PYTHON
ARG PACKAGES
ARG IMPORTS
ARG IMPORT_PATH
# The trainer's program started as a job starts it (START_CHECK, a JSON list of python3's
# arguments: jobgen's wrapper --check and the program; images.yaml `starts`; none for nxd).
ARG START_CHECK

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The entrypoint needs bash, python3, ip (iproute2), hostname, setsid (util-linux), awk.
RUN apt-get update \
 && apt-get install -y --no-install-recommends iproute2 util-linux gawk git ca-certificates \
      build-essential \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /workspace
COPY env/containers/build_check.py /tmp/jobgen-build-check.py
# The base is the one declared; keep its torch, torch-neuronx and friends: nothing installed
# below may replace them.
RUN python3 /tmp/jobgen-build-check.py base \
 && python3 /tmp/jobgen-build-check.py constraints \
      '(torch|torch[-_]neuronx|torch[-_]xla|neuronx[-_]cc|libneuronxla|neuronx[-_]distributed|numpy)' \
      > /tmp/keep.txt

# Checkouts land where images.yaml declares them (NEMO_CHECKOUT, NXD_CHECKOUT); jobs rendered
# for SageMaker, EKS and Batch point the trainer there.
RUN case "$TRAINER" in nxd | nemo) ;; *) echo "TRAINER must be nxd or nemo" >&2; exit 1 ;; esac
# As neuronx-nemo-megatron's own Dockerfile does: Cython before the wheels are built, its
# requirements-docker.txt with PACKAGES (images.yaml: protobuf 3.20), then the Megatron dataset
# helper (built from outside the checkout, so that the installed package is the one imported).
RUN if [ "$TRAINER" = nemo ]; then \
      git clone "$NEMO_REPO" "$NEMO_CHECKOUT" \
      && git -C "$NEMO_CHECKOUT" checkout "$NEMO_REF" \
      && cd "$NEMO_CHECKOUT" \
      && python3 -m pip install -c /tmp/keep.txt wheel Cython \
      && ./build.sh \
      && python3 -m pip install -c /tmp/keep.txt ./build/*.whl \
      && read -ra packages <<< "$PACKAGES" \
      && python3 -m pip install -c /tmp/keep.txt -r requirements-docker.txt "${packages[@]}" \
      && cd / \
      && python3 -c "from nemo.collections.nlp.data.language_modeling.megatron.dataset_utils import compile_helper; compile_helper()"; \
    fi
RUN if [ "$TRAINER" = nxd ]; then \
      git clone "$NXD_REPO" "$NXD_CHECKOUT" \
      && git -C "$NXD_CHECKOUT" checkout "$NXD_REF" \
      && for req in "$NXD_CHECKOUT/examples/training/llama/requirements.txt" \
                    "$NXD_CHECKOUT/examples/training/llama/tp_zero1_llama_hf_pretrain/requirements.txt"; do \
           if [ -f "$req" ]; then python3 -m pip install -c /tmp/keep.txt -r "$req"; fi; \
         done \
      && read -ra packages <<< "$PACKAGES" \
      && if (( ${#packages[@]} )); then \
           python3 -m pip install -c /tmp/keep.txt "${packages[@]}"; \
         fi; \
    fi
RUN rm -f /tmp/keep.txt

# jobgen: the payload and the entrypoint the job definition's command names.
COPY payload/ ${JOBGEN_DIR}/payload/
# The payload's digest, which every job rendered for it names: build from the context that
# `jobgen image-context DIR` writes (a checkout's payload/ has no digest file).
RUN test -s "$JOBGEN_DIR/payload/.jobgen-digest" \
 || { echo 'no payload digest: build from `jobgen image-context DIR`' >&2; exit 1; }
# The entrypoints of Batch, SageMaker training jobs and EKS pods: the same image runs on each.
COPY env/containers/entrypoint.sh env/containers/sagemaker-entrypoint.sh \
     env/containers/eks-entrypoint.sh ${JOBGEN_DIR}/
# What the trainer and the payload import, imported as they run (NeMo's dataset helper built
# above, the payload's modules), the trainer's program started as a job starts it (no path
# added: its own siblings must be found as on a node), and the node's file writer.
RUN chmod 0755 "$JOBGEN_DIR"/*.sh \
 && for f in "$JOBGEN_DIR"/*.sh; do bash -n "$f"; done \
 && python3 -m py_compile "$JOBGEN_DIR/payload/common/batch_setup.py" \
 && python3 /tmp/jobgen-build-check.py imports \
 && python3 /tmp/jobgen-build-check.py start \
 && rm /tmp/jobgen-build-check.py
ENV JOBGEN_DIR=${JOBGEN_DIR}

# CMD, not ENTRYPOINT: the Batch job definition's command names the entrypoint and its arguments.
CMD ["/bin/bash", "-c", "exec \"$JOBGEN_DIR/entrypoint.sh\""]
