#!/bin/sh
# Self-test of tests/vm/run-in-vm: the command's exit code must come back
# (7) and the VM must be a pure cgroup v2 host (memory controller in the
# root's cgroup.controllers) where unprivileged user namespaces work.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(mktemp "${TMPDIR:-/tmp}/berth-vm-selftest.XXXXXX") || exit 1
trap 'rm -f "$OUT"' EXIT INT TERM

"$HERE/run-in-vm" "$@" -- sh -c 'cat /sys/fs/cgroup/cgroup.controllers; grep -q memory /sys/fs/cgroup/cgroup.controllers && unshare -U -r id -u && exit 7' >"$OUT"
rc=$?
cat "$OUT"

fail=0
if [ "$rc" -ne 7 ]; then
	echo "selftest: FAIL: exit code $rc, expected 7" >&2
	fail=1
fi
if ! grep -qw memory "$OUT"; then
	echo "selftest: FAIL: the output does not list the memory controller" >&2
	fail=1
fi
if [ "$fail" = 0 ]; then
	echo "selftest: PASS (exit code 7 passed through; cgroup v2 with memory controller)" >&2
fi
exit "$fail"
