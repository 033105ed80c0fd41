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

ARG GAUDI_VERSION
# Habana's DeepSpeed fork is NOT part of the PyTorch image: it is installed here, at the tag of the
# Gaudi software release (public DeepSpeed does not run on HPU).
ARG HABANA_DEEPSPEED=git+https://github.com/HabanaAI/DeepSpeed.git@${GAUDI_VERSION}
# The payload's own needs (Hugging Face BERT model, hdf5 shards); transformers 5 wants a newer
# torch than these images carry.
ARG PAYLOAD_REQUIREMENTS="transformers>=4.40,<5 h5py"
# EFA in the container (libfabric with the efa provider) and Habana's HCCL-over-libfabric shim,
# which HCCL_OVER_OFI=1 (the recipe's environment) needs for scale-out over EFA.
ARG INSTALL_EFA=1
ARG EFA_INSTALLER_URL=https://efa-installer.amazonaws.com/aws-efa-installer-latest.tar.gz
ARG HCCL_OFI_WRAPPER_REPO=https://github.com/HabanaAI/hccl_ofi_wrapper.git
ARG HCCL_OFI_WRAPPER_REF=main
# Where jobgen's files go (env/containers/images.yaml; `jobgen image-context` passes it).
ARG JOBGEN_DIR=/opt/jobgen

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The entrypoint needs bash, python3, ip (iproute2), hostname, setsid (util-linux), awk.
RUN apt-get update \
 && apt-get install -y --no-install-recommends iproute2 util-linux gawk curl git ca-certificates \
      build-essential \
 && rm -rf /var/lib/apt/lists/*

RUN if [ "$INSTALL_EFA" = 1 ]; then \
      cd /tmp \
      && curl -fsSL -o efa.tar.gz "$EFA_INSTALLER_URL" \
      && tar -xzf efa.tar.gz \
      && cd aws-efa-installer \
      && ./efa_installer.sh -y -g -d --skip-kmod --skip-limit-conf --no-verify \
      && cd / && rm -rf /tmp/aws-efa-installer /tmp/efa.tar.gz \
      && git clone "$HCCL_OFI_WRAPPER_REPO" /opt/hccl_ofi_wrapper \
      && git -C /opt/hccl_ofi_wrapper checkout "$HCCL_OFI_WRAPPER_REF" \
      && { [ -e /opt/amazon/efa/lib ] || ln -s /opt/amazon/efa/lib64 /opt/amazon/efa/lib; } \
      && make -C /opt/hccl_ofi_wrapper LIBFABRIC_ROOT=/opt/amazon/efa; \
    fi
ENV LD_LIBRARY_PATH=/opt/hccl_ofi_wrapper:/opt/amazon/efa/lib:/opt/amazon/efa/lib64:${LD_LIBRARY_PATH}

# Keep the image's own torch (Habana's build) and numpy: nothing installed below may replace them.
RUN python3 -m pip freeze | grep -iE '^(torch|numpy|habana[-_a-z]*)==' > /tmp/keep.txt \
 && python3 -m pip install -c /tmp/keep.txt "$HABANA_DEEPSPEED" \
 && python3 -m pip install -c /tmp/keep.txt $PAYLOAD_REQUIREMENTS \
 && python3 -c "import deepspeed, transformers, h5py, habana_frameworks.torch" \
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
RUN chmod 0755 "$JOBGEN_DIR"/*.sh \
 && for f in "$JOBGEN_DIR"/*.sh; do bash -n "$f"; done \
 && python3 -m py_compile "$JOBGEN_DIR/payload/common/batch_setup.py"
ENV JOBGEN_DIR=${JOBGEN_DIR}

# Relative site paths (the `local` site's jobgen-runs/...) are taken from here.
WORKDIR /workspace
# CMD, not ENTRYPOINT: the Batch job definition's command names the entrypoint and its arguments.
CMD ["/bin/bash", "-c", "exec \"$JOBGEN_DIR/entrypoint.sh\""]
