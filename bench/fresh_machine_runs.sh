#!/usr/bin/env bash
# The README's two commands as a new user runs them: a fresh clone in a fresh venv, with a
# CPU-heavy process (`python -c 'while 1: pass'`) running beside them the whole time.
# Runs `bash scripts/main.sh` MAIN_RUNS times, then `bash .ci/run` CI_RUNS times, and appends
# one line per run (UTC start, machine, command, pass/fail, exit status, wall time, load
# average) to LOG. Usage:
#   bash bench/fresh_machine_runs.sh REPO_URL_OR_PATH LOG [MAIN_RUNS] [CI_RUNS]
set -uo pipefail
src=${1:?repository to clone}
log=${2:?log file}
main_runs=${3:-3}
ci_runs=${4:-5}
work=$(mktemp -d /tmp/kp-fresh.XXXXXX)
log=$(realpath "$log")
git clone -q "$src" "$work/clone"
python3 -m venv "$work/venv"
# shellcheck disable=SC1091
source "$work/venv/bin/activate"
cd "$work/clone" || exit 2
commit=$(git rev-parse --short=12 HEAD)
machine="$(hostname), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
python3 -c 'while 1: pass' &
hog=$!
trap 'kill "$hog" 2>/dev/null' EXIT
echo "| UTC start | machine | commit | command | result | exit | wall s | load avg at start |" >>"$log"
echo "|---|---|---|---|---|---:|---:|---:|" >>"$log"
run() {
  local what=$1
  shift
  local start end rc load
  start=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  load=$(cut -d' ' -f1 /proc/loadavg)
  local t0=$SECONDS
  "$@" >"$work/last.log" 2>&1
  rc=$?
  end=$((SECONDS - t0))
  local result=PASS
  [ "$rc" = 0 ] || result=FAIL
  echo "| $start | $machine | $commit | $what (beside a busy loop) | $result | $rc | $end | $load |" >>"$log"
  cp "$work/last.log" "$work/$(echo "$what" | tr -c 'a-z0-9' '_')-$start.log"
  tail -3 "$work/last.log"
}
for _ in $(seq "$main_runs"); do run "bash scripts/main.sh" bash scripts/main.sh; done
for _ in $(seq "$ci_runs"); do run "bash .ci/run" bash .ci/run; done
echo "logs of every run: $work"
