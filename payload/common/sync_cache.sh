#!/usr/bin/env bash
# Copies the shared Neuron compile cache to this node's local disk before training.
# usage: sync_cache.sh SHARED_DIR LOCAL_DIR
# Copies into a fresh directory and swaps it in, so that a half-finished copy is never used.
# It only ever replaces a directory that it made itself (marked with .jobgen-node-cache): a
# mistyped LOCAL_DIR such as a home directory is refused, never moved or deleted.
set -euo pipefail
src=${1:?shared cache directory}
dst=${2:?node-local cache directory}
mark=.jobgen-node-cache
say() { printf 'jobgen: %s\n' "$*" >&2; }

case $dst in
  /*) ;;
  *) say "the node-local cache must be an absolute path, got '$dst'"; exit 2 ;;
esac
dst=${dst%/}
if [ -z "$dst" ] || [ "$dst" = "${HOME%/}" ] || [ "$(dirname "$dst")" = / ]; then
  say "refusing to use '$2' as a node-local cache (too close to / or a home directory)"
  exit 2
fi
if [ ! -d "$src" ]; then
  say "no compile cache at $src to copy"
  exit 1
fi
if [ -e "$dst" ] && [ ! -e "$dst/$mark" ]; then
  say "$dst exists and was not made by jobgen; refusing to replace it"
  exit 2
fi
mkdir -p "$(dirname "$dst")"
staging="$dst.incoming.$$"
old="$dst.old.$$"
mkdir "$staging"
cp -a "$src/." "$staging/"
printf 'copied from %s\n' "$src" > "$staging/$mark"
if [ -e "$dst" ]; then mv "$dst" "$old"; fi
mv "$staging" "$dst"
if [ -e "$old/$mark" ]; then rm -rf "$old"; fi
say "compile cache copied to $dst on ${SLURMD_NODENAME:-$(hostname)}"
