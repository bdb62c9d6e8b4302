#!/usr/bin/env bash
# Cycles per row-position (one table lookup and one f32 addition) of the
# rvq3 row walk on aarch64 cores, by llvm-mca's scheduling models: the
# portable loop (what aarch64 runs) against the NEON tbl/tbx formulations in
# rvq3_neon.rs. Needs the aarch64-unknown-linux-gnu rustup target and
# llvm-mca (Debian: apt-get install llvm-19). A model, not a measurement:
# rerun `waste bench` on the hardware before trusting either way.
set -euo pipefail
cd "$(dirname "$0")"
MCA=${MCA:-$(command -v llvm-mca-19 || command -v llvm-mca)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rustc --edition 2021 --crate-type=lib --target aarch64-unknown-linux-gnu -C opt-level=3 --emit asm \
    -o "$out/k.s" rvq3_neon.rs
# Each function's innermost backward-branching loop, as a file for llvm-mca.
python3 - "$out" <<'PY'
import re, sys
out = sys.argv[1]
lines = open(f"{out}/k.s").read().split("\n")
for fn in ("scalar8", "neon16", "neon64"):
    body = lines[lines.index(fn + ":") + 1:]
    body = body[:next(i for i, l in enumerate(body) if ".cfi_endproc" in l)]
    labels = {l.strip()[:-1]: i for i, l in enumerate(body) if re.match(r"^\.LBB\w+:$", l.strip())}
    for i, l in enumerate(body):
        m = re.search(r"(\.LBB\w+)$", l.strip())
        if m and l.strip().startswith(("b", "cb", "tb")) and labels.get(m.group(1), i) < i:
            loop = [x for x in body[labels[m.group(1)] + 1:i + 1] if x.strip() and not x.strip().startswith((".", "//"))]
            open(f"{out}/{fn}.s", "w").write("\n".join(loop) + "\n")
PY
# Row-positions per loop iteration: 8 rows x 8 positions, 16 rows x 1, 64 x 1.
printf "%-12s %10s %10s %10s %14s\n" cpu portable neon16 neon64 "best neon/portable"
for cpu in neoverse-n1 neoverse-n2 neoverse-v1 neoverse-v2 cortex-a72 cortex-a55 apple-m1; do
    row=()
    for f in scalar8:64 neon16:16 neon64:64; do
        cycles=$("$MCA" -mtriple=aarch64 -mcpu="$cpu" -iterations=200 "$out/${f%:*}.s" | awk '/^Total Cycles/{print $3}')
        row+=("$(python3 -c "print(f'{$cycles / 200 / ${f#*:}:.2f}')")")
    done
    ratio=$(python3 -c "print(f'{min(${row[1]}, ${row[2]}) / ${row[0]}:.2f}')")
    printf "%-12s %10s %10s %10s %14s\n" "$cpu" "${row[@]}" "$ratio"
done
