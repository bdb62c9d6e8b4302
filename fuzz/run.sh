#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 600) one after another, each
# from its committed seeds (fuzz/seeds/TARGET, plus the GGUF and tokenizer
# fixtures) into a scratch corpus, and prints one summary line per target:
#   TARGET  runs  seconds  exec/s  corpus  crashes
# Needs the nightly toolchain and cargo-fuzz (cargo install cargo-fuzz).
# Usage: fuzz/run.sh [SECONDS] [TARGET...]
set -uo pipefail
cd "$(dirname "$0")"
seconds=${1:-600}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(manifest record codebooks state usage tiktoken tokenizer_json gguf chat_input tokenize_text)
work=${WASTE_FUZZ_WORK:-/tmp/waste-fuzz-work}
mkdir -p "$work"
cargo +nightly fuzz build >/dev/null || exit 1
# The binaries are run directly: `cargo fuzz run` would rebuild them first
# whenever the engine's sources changed since, mid-campaign.
bin=target/x86_64-unknown-linux-gnu/release
for t in "${targets[@]}"; do
    seeds=(seeds/$t)
    max_len=65536
    case $t in
        gguf) seeds+=(../tests/fixtures/gguf/misc ../tests/fixtures/gguf/malformed ../tests/fixtures/gguf/types); max_len=262144 ;;
        record | codebooks) max_len=8192 ;;
        tokenize_text) seeds+=(../tests/fixtures/tokenizer); max_len=16384 ;;
    esac
    mkdir -p "$work/corpus/$t" "$work/artifacts/$t"
    log="$work/$t.log"
    "$bin/$t" "$work/corpus/$t" "${seeds[@]}" \
        -max_total_time="$seconds" -max_len=$max_len -timeout=10 -rss_limit_mb=4096 \
        -artifact_prefix="$work/artifacts/$t/" -print_final_stats=1 >"$log" 2>&1
    rc=$?
    runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
    took=$(grep -oE 'Done [0-9]+ runs in [0-9]+ second' "$log" | grep -oE 'in [0-9]+' | grep -oE '[0-9]+' | tail -1)
    rate=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
    crashes=$(find "$work/artifacts/$t" -type f | wc -l)
    corpus=$(find "$work/corpus/$t" -type f | wc -l)
    echo "$t runs=${runs:-?} seconds=${took:-?} exec_per_s=${rate:-?} corpus=$corpus crashes=$crashes rc=$rc"
done
