# The GPU image of the smp_fsdp payload: a SageMaker PyTorch training image (it carries SMP v2,
# torch.sagemaker, and EFA/NCCL) with jobgen's payload and entrypoints. Build from the context
# `jobgen image-context DIR` writes, with the image of your region and the PyTorch release SMP v2
# supports there:
# `jobgen image-context DIR --site SITE` prints the build, with BASE_IMAGE (SMP v2's image in
# the site's region, env/containers/images.yaml) and the docker login its registry needs.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
# Where jobgen's files go (env/containers/images.yaml; `jobgen image-context` passes it).
ARG JOBGEN_DIR=/opt/jobgen

# What the payload imports beyond the image: the Hugging Face model code and datasets.
RUN python3 -m pip install --no-cache-dir "transformers>=4.36" "datasets>=2.16" tensorboard

COPY payload/ ${JOBGEN_DIR}/payload/
# The payload's digest, which every job rendered for it names: build from the context that
# `jobgen image-context DIR` writes (a checkout's payload/ has no digest file).
RUN test -s "$JOBGEN_DIR/payload/.jobgen-digest" \
 || { echo 'no payload digest: build from `jobgen image-context DIR`' >&2; exit 1; }
COPY env/containers/sagemaker-entrypoint.sh env/containers/eks-entrypoint.sh ${JOBGEN_DIR}/
RUN chmod 0755 "$JOBGEN_DIR"/*.sh \
 && for f in "$JOBGEN_DIR"/*.sh; do bash -n "$f"; done \
 && python3 -m py_compile "$JOBGEN_DIR/payload/smp_fsdp/train_fsdp.py"
ENV JOBGEN_DIR=${JOBGEN_DIR}
