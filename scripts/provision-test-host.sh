#!/usr/bin/env bash
# Makes this machine able to run `make install` / `make test`: the one place that knows what they need.
#
#   scripts/provision-test-host.sh install   what `make install` needs: python3 (>= 3.10) with venv
#   scripts/provision-test-host.sh test      what `make test` needs too: OpenSSH's sshd, sftp-server and client
#                                            (the test target), unshare, pkill, ss/ip, nft (fault tests)
#   scripts/provision-test-host.sh browser   what `make test-browser` needs too: Debian's chromium and
#                                            chromium-driver (the dashboard's browser tests, tests/browser)
#   add --dry-run to print the decision (the packages and the command) and change nothing.
#
# Nothing missing: silent, exit 0. Missing and root with apt-get: installs them (Debian/Ubuntu package names).
# Otherwise: one line naming the command to run, exit 1. Used by the Makefile and by .ci/run.
#
# Test seams (tests/unit/test_provision.py; never needed by users): DEPLOYER_PROVISION_ROOT prefixes the
# absolute paths probed, DEPLOYER_PROVISION_EUID stands for the effective uid, PYTHON names the interpreter.
set -euo pipefail

ROOT="${DEPLOYER_PROVISION_ROOT:-}"
EUID_NOW="${DEPLOYER_PROVISION_EUID:-$EUID}"
PYTHON="${PYTHON:-python3}"
level="${1:-}"
dry_run=0
[ "${2:-}" = "--dry-run" ] && dry_run=1
case "$level" in
  install|test) make_target="make $level" ;;
  browser) make_target="make test-browser" ;;
  *) echo "usage: $0 install|test|browser [--dry-run]" >&2; exit 2 ;;
esac

need=()
add() { local p; for p in "$@"; do [[ " ${need[*]-} " == *" $p "* ]] || need+=("$p"); done; }

# A tool on PATH, or in the sbin dirs that a non-root PATH often lacks.
have() { command -v "$1" >/dev/null 2>&1 || [ -x "$ROOT/usr/sbin/$1" ] || [ -x "$ROOT/sbin/$1" ]; }

python_ok() {  # python >= 3.10 that can make a venv with pip (Debian splits ensurepip into python3-venv)
  command -v "$PYTHON" >/dev/null 2>&1 &&
    "$PYTHON" -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1
}

python_ok || add python3 python3-venv
if [ "$level" = test ]; then
  [ -x "$ROOT/usr/sbin/sshd" ] || add openssh-server                  # the test target (tests/sshbed.py)
  [ -x "$ROOT/usr/lib/openssh/sftp-server" ] || add openssh-sftp-server  # deployer pushes files over SFTP
  for tool in ssh ssh-keygen ssh-agent ssh-add; do have "$tool" || add openssh-client; done  # keys, ProxyCommand
  have unshare || add util-linux          # sshd in its own PID namespace: nothing outlives a test
  have pkill || add procps                # ends a timed-out remote command's session
  have ss || add iproute2                 # preflight's port check on the test target
  have ip || add iproute2                 # network namespaces of the fault tests
  have nft || add nftables                # partitions in the fault tests
  [ -x "$ROOT/usr/bin/python3" ] || add python3  # the test target's python3 (supervisor, stand-in engine)
fi
if [ "$level" = browser ]; then
  [ -x "$ROOT/usr/bin/chromium" ] || add chromium                # headless, for the dashboard's browser tests
  [ -x "$ROOT/usr/bin/chromedriver" ] || add chromium-driver     # Selenium drives chromium through it
fi

if [ ${#need[@]} -eq 0 ]; then
  [ $dry_run -eq 1 ] && echo "nothing to install"
  exit 0
fi

command="apt-get install -y ${need[*]}"
if [ "$EUID_NOW" != 0 ] || ! have apt-get; then
  if have apt-get; then
    line="$make_target needs ${need[*]}: run  sudo apt-get update && sudo $command  (or run $make_target as root)"
  else
    line="$make_target needs ${need[*]} (Debian package names): install them with your package manager"
  fi
  [ $dry_run -eq 1 ] && { echo "would stop: $line"; exit 0; }
  echo "$line" >&2
  exit 1
fi

if [ $dry_run -eq 1 ]; then
  echo "would run: apt-get update && $command"
  exit 0
fi
echo "$make_target needs ${need[*]}: installing them with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq "${need[@]}"; } >&2; then
  echo "apt-get could not install ${need[*]}; install them, then run $make_target again" >&2
  exit 1
fi
command -p mkdir -p -m 0755 "$ROOT/run/sshd"  # sshd's privilege-separation dir
