#!/usr/bin/env bash
# Starts the CPU stand-in trainer (train.py: a tiny GPT-NeoX or Llama) on this node under
# torchrun, in place of the Neuron trainer of a recipe rehearsed with --smoke.
# usage: launch.sh compile|train FLAG...  (flags from jobgen)
set -u
# shellcheck source=../common/node_launch.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/node_launch.sh"
node_launch "$@"
