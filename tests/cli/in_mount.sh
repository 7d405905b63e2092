#!/usr/bin/env bash
# Runs a command with a file system of TYPE mounted at DIR (created if missing), then says what the
# command left in DIR ("in_mount: left in DIR: none") and unmounts it. Exits with the command's code.
# Where this process cannot mount (not root, no CAP_SYS_ADMIN), it prints "SKIPPED: ..." and exits
# 77; the ctest that uses it marks itself skipped on that text (SKIP_REGULAR_EXPRESSION).
# usage: in_mount.sh TYPE OPTIONS DIR COMMAND [ARGS...]
set -u
type=$1 options=$2 dir=$3
shift 3
mkdir -p "$dir" || exit 1
if ! reason=$(mount -t "$type" -o "$options" "$type" "$dir" 2>&1); then
  echo "SKIPPED: cannot mount $type at $dir here: $reason"
  exit 77
fi
trap 'umount "$dir"; rmdir "$dir"' EXIT
"$@"
code=$?
left=$(ls -A "$dir")
echo "in_mount: left in $dir: ${left:-none}"
exit "$code"
