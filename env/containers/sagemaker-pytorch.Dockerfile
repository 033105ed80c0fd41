# The GPU image of the smp_fsdp payload: a SageMaker PyTorch training image (it carries SMP v2,
# torch.sagemaker, and EFA/NCCL) with jobgen's payload and entrypoints. Build from the context
# `jobgen image-context DIR` writes, with the image of your region and the PyTorch release SMP v2
# supports there:
#   docker build -f DIR/env/containers/sagemaker-pytorch.Dockerfile -t jobgen-smp:<payload id> \
#     --build-arg BASE=<a SageMaker PyTorch GPU training image with SMP v2 for your region> DIR
# and name it in the site's sagemaker.images (and eks.images) under p4d.24xlarge.
ARG BASE
FROM ${BASE}

# What the payload imports beyond the image: the Hugging Face model code and datasets.
RUN python3 -m pip install --no-cache-dir "transformers>=4.36" "datasets>=2.16" tensorboard

COPY payload/ /opt/jobgen/payload/
# The payload's digest, which every job rendered for it names: build from the context that
# `jobgen image-context DIR` writes (a checkout's payload/ has no digest file).
RUN test -s /opt/jobgen/payload/.jobgen-digest \
 || { echo 'no payload digest: build from `jobgen image-context DIR`' >&2; exit 1; }
COPY env/containers/sagemaker-entrypoint.sh env/containers/eks-entrypoint.sh /opt/jobgen/
RUN chmod 0755 /opt/jobgen/*.sh \
 && for f in /opt/jobgen/*.sh; do bash -n "$f"; done \
 && python3 -m py_compile /opt/jobgen/payload/smp_fsdp/train_fsdp.py
