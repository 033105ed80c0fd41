#!/usr/bin/env bash
# Starts our BERT pretraining program (pretrain_bert.py) on this node under torchrun: one worker
# per Gaudi (or per CPU process in a smoke rehearsal), node rank = the node's index, so no SSH
# and no hostfile are needed. usage: launch.sh compile|train FLAG...  (flags from jobgen)
set -u
# shellcheck source=../common/node_launch.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/node_launch.sh"
node_launch "$@"
