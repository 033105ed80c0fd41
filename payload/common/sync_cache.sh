#!/usr/bin/env bash
# Copies the shared Neuron compile cache to this node's local disk before training.
# usage: sync_cache.sh SHARED_DIR LOCAL_DIR
# Copies into a fresh directory and swaps it in, so that a half-finished copy is never used.
set -euo pipefail
src=${1:?shared cache directory}
dst=${2:?node-local cache directory}
if [ ! -d "$src" ]; then
  printf 'jobgen: no compile cache at %s to copy\n' "$src" >&2
  exit 1
fi
mkdir -p "$(dirname "$dst")"
staging="$dst.incoming.$$"
rm -rf "$staging"
mkdir -p "$staging"
cp -a "$src/." "$staging/"
rm -rf "$dst.old"
if [ -e "$dst" ]; then mv "$dst" "$dst.old"; fi
mv "$staging" "$dst"
rm -rf "$dst.old"
printf 'jobgen: compile cache copied to %s on %s\n' "$dst" "${SLURMD_NODENAME:-$(hostname)}" >&2
