#!/bin/sh
# Inside the VM: berth end to end on cgroup v2 (run by run-in-vm).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
base="${BERTH_VM_SCRATCH:?run me through tests/vm/run-in-vm}"
"$root/scripts/make-busybox-rootfs" "$base/rootfs"
export BERTH_RUNTIME_DIR="$base/run" BERTH_STATE_DIR="$base/state"
export BERTH_SOCKET="$base/run/berth.sock"
chmod 755 "$base"
"$root/build/src/runtime/berthd" --cgroup-parent berth-vm 2>"$base/berthd.log" &
for _ in $(seq 200); do [ -S "$BERTH_SOCKET" ] && break; sleep 0.05; done
B="$root/build/src/runtime/berth"
$B doctor
id=$($B create --rootfs "$base/rootfs" -m 32m --pids 50) || { dmesg | tail -5; exit 1; }
$B exec "$id" -- sh -c 'id; cat /proc/self/cgroup'
$B exec "$id" -- sh -c 'x=a; while true; do x="$x$x"; done' || echo "oom exit $?"; dmesg | grep -iE "killed process|oom" | tail -5; $B exec "$id" -- sh -c "cat /proc/1/oom_score_adj /proc/self/oom_score_adj; ps"
$B inspect "$id" || true
cat "$base/berthd.log"
