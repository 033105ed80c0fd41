#!/usr/bin/env bash
# Starts the FSDP trainer (train_fsdp.py: Llama or GPT-NeoX, SMP v2 where the image has it) on
# this node under torchrun: one rank per GPU, or two CPU processes in a --smoke rehearsal.
# usage: launch.sh compile|train FLAG...  (flags from jobgen)
set -u
# shellcheck source=../common/node_launch.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/node_launch.sh"
node_launch "$@"
