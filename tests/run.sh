#!/usr/bin/env bash
# The whole test suite from a fresh clone: `tests/run.sh [PYTEST ARGS...]`.
#
# 1. System packages the tests start (sshd, ssh, pgrep/ps, git, nft, sudo, python3-venv, prometheus,
#    prometheus-alertmanager, prometheus-node-exporter): apt-get, only for
#    what is missing (needs root then).
# 2. A venv of its own, $DSV4KIT_TEST_VENV (default .venv in the clone, git-ignored), without the
#    system site-packages: torch==2.13.0 first (pip's CPU build where it has one), then the
#    '.[test]' extra under a torch==2.13.0 constraint. Skipped when pyproject.toml and this script
#    are unchanged since the last install.
# 3. pytest, in that venv, on $DSV4KIT_TEST_WORKERS workers (default 2; 0: one process).
#    "No tests collected" (pytest exit 5) is a failure.
#
# The tests cache the SGLang 0.5.23 wheel and what is built from it in $DSV4KIT_CACHE (default
# ~/.cache/dsv4kit); see tests/sglang_wheel.py.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${DSV4KIT_TEST_VENV:-$PWD/.venv}"
PYTHON="${PYTHON:-python3}"
TORCH_PIN="torch==2.13.0"

say() { printf 'tests/run.sh: %s\n' "$*" >&2; }

missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
{ command -v ssh && command -v ssh-keygen; } >/dev/null 2>&1 || missing+=(openssh-client)
{ command -v pgrep && command -v ps; } >/dev/null 2>&1 || missing+=(procps)
command -v git >/dev/null 2>&1 || missing+=(git)
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || missing+=(nftables)  # the firewall ruleset check
command -v sudo >/dev/null 2>&1 || missing+=(sudo)  # a non-root login that becomes root, as on a real box
# monitoring: the real Prometheus (promtool), Alertmanager and node_exporter (tests/monitoring)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
command -v prometheus-node-exporter >/dev/null 2>&1 || missing+=(prometheus-node-exporter)
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  missing+=(python3 python3-venv)
elif ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=(python3-venv)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    say "missing system packages: ${missing[*]} (install them, or run this as root on Debian/Ubuntu)"
    exit 5
  fi
  say "installing system packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

stamp="$VENV/.dsv4kit-test-install"
want="$(cat pyproject.toml tests/run.sh | sha256sum | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "setting up $VENV"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  rm -f "$stamp"
  constraints="$VENV/torch-constraint.txt"
  echo "$TORCH_PIN" >"$constraints"
  # pip >= 23.1: the tests install into other venvs with `pip --python` (an older distro's venv
  # comes with an older pip).
  "$VENV/bin/python" -m pip install -q "pip>=23.1"
  "$VENV/bin/python" -m pip install -q "$TORCH_PIN"
  "$VENV/bin/python" -m pip install -q -c "$constraints" -e '.[test]'
  echo "$want" >"$stamp"
fi

export PATH="$VENV/bin:$PATH"
unset PYTHONPATH PYTHONHOME
set +e
# Two workers, each taking whole test files (module fixtures stay shared within a file);
# DSV4KIT_TEST_WORKERS=0 runs in one process.
workers="${DSV4KIT_TEST_WORKERS:-2}"
if [ "$workers" = "0" ]; then
  "$VENV/bin/python" -m pytest -q "$@"
else
  "$VENV/bin/python" -m pytest -q -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
fi
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  say "pytest collected no tests"
  exit 1
fi
exit "$rc"
