# shellcheck shell=bash
# The flow's common ground, sourced first by job_flow.sh and by every stage file's tests: its
# exit statuses, how it speaks, and small helpers. Nothing here reads the node contract.

# Exit statuses: 78 (EX_CONFIG) for a failure that no restart can cure (the launcher classifies
# it); 75 (EX_TEMPFAIL) for a node the health gate found bad (the job could run elsewhere).
# shellcheck disable=SC2034  # read by the stage files
FLOW_CONFIG_ERROR=78
# shellcheck disable=SC2034  # read by the stage files
FLOW_UNHEALTHY=75
FLOW_WHO=${FLOW_WHO:-jobgen}

flow_say() { printf '%s: %s\n' "$FLOW_WHO" "$*" >&2; }
# flow_fail MESSAGE [STATUS]: say MESSAGE and exit with STATUS (default 1): an entrypoint's refusal.
flow_fail() {
  flow_say "$1"
  exit "${2:-1}"
}
# flow_now: the time as epoch seconds, with nanoseconds where date has them (GNU date).
flow_now() {
  local t
  t=$(date +%s.%N 2>/dev/null)
  case $t in '' | *[!0-9.]*) date +%s ;; *) printf '%s\n' "$t" ;; esac
}
flow_is_count() { case $1 in '' | *[!0-9]*) return 1 ;; *) return 0 ;; esac; }
# flow_next_attempt ROOT NODE: the folder of this node's next attempt under ROOT
# (ROOT/attempt-N, N counting the attempts this node already logged there), for services that
# restart a job's containers without telling them how often (SageMaker retries, EKS pods).
flow_next_attempt() {
  local n=1
  while [ -e "$1/attempt-$n/node-$2" ]; do n=$((n + 1)); done
  printf '%s/attempt-%s\n' "$1" "$n"
}
flow_absolute() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s/%s\n' "$PWD" "$1" ;; esac; }
