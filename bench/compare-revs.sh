#!/usr/bin/env bash
# Runs one cargo bench of the working tree and of an earlier revision side
# by side, alternating, so both see the same machine (it is shared and
# noisy: figures from separate runs are not comparable). The revision is
# built in a worktree with a target directory of its own under
# ~/.cache/waste-bench/, kept between runs.
#
#   bench/compare-revs.sh REV [-n ROUNDS] -- CARGO_BENCH_ARGS... [-- BENCH_ARGS...]
#   bench/compare-revs.sh c174a99 -- -p waste-kernels --bench kernels -- --quick
#
# Each round prints the revision's output, then the working tree's, each
# under a header naming it and the load average. docs/PERFORMANCE.md names
# the revision its "before" columns came from.
#
# OLD_CARGO_ARGS replaces the cargo arguments for the revision, when a
# bench moved between crates (`-p waste-host --bench kernels` before the
# host split); OLD_TARGET_DIR its target directory (a directory that
# already holds a build of the same dependencies saves rebuilding them; not
# the working tree's own, which the script refuses: see below).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 REV [-n ROUNDS] -- CARGO_BENCH_ARGS..." >&2; exit 2; }
rev="$1"; shift
rounds=3
if [ "${1:-}" = "-n" ]; then rounds="$2"; shift 2; fi
[ "${1:-}" = "--" ] && shift
commit="$(git -C "$root" rev-parse --short "$rev^{commit}")"
cache="${WASTE_BENCH_CACHE:-$HOME/.cache/waste-bench}"
tree="$cache/tree-$commit"
mkdir -p "$cache"
if [ ! -d "$tree" ]; then
  git -C "$root" worktree add --detach --quiet "$tree" "$commit"
fi
# The bench binaries, built once each: `cargo bench --no-run` prints where.
bench_bin() { # DIR TARGET_DIR ARGS...
  local dir="$1" target="$2"; shift 2
  (cd "$dir" && CARGO_TARGET_DIR="$target" cargo bench --no-run --message-format=json "${cargo_args[@]}" 2>/dev/null) |
    python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and "bench" in m["target"]["kind"]:
        print(m["executable"])' | tail -n 1
}
cargo_args=(); bench_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do cargo_args+=("$1"); shift; done
[ "${1:-}" = "--" ] && { shift; bench_args=("$@"); }
new_args=("${cargo_args[@]}")
if [ -n "${OLD_CARGO_ARGS:-}" ]; then read -r -a cargo_args <<< "$OLD_CARGO_ARGS"; fi
old="$(bench_bin "$tree" "${OLD_TARGET_DIR:-$cache/target-$commit}")"
cargo_args=("${new_args[@]}")
new="$(bench_bin "$root" "${CARGO_TARGET_DIR:-$root/target}")"
[ -x "$old" ] && [ -x "$new" ] || { echo "could not build the bench (old: '$old', new: '$new')" >&2; exit 1; }
# One target directory for both builds gives both the same executable path
# (cargo's hash does not tell the worktree's packages from ours), and the
# second build overwrites the first: both columns would run the new code.
[ "$old" != "$new" ] || { echo "the revision and the working tree built to the same executable $new: give OLD_TARGET_DIR a directory of its own" >&2; exit 1; }
for ((i = 1; i <= rounds; i++)); do
  for which in old new; do
    bin="$old"; name="$commit"
    [ "$which" = new ] && { bin="$new"; name="working tree"; }
    echo "=== round $i: $name (load $(cut -d' ' -f1-3 /proc/loadavg))"
    (cd "$([ "$which" = new ] && echo "$root" || echo "$tree")" && "$bin" --bench "${bench_args[@]}")
  done
done
