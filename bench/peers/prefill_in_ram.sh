#!/bin/bash
# Prefill on one GGUF file, every weight in RAM (page cache warm): llama.cpp vs WASTE
# (the file in place, and its q4 conversion), alternating. Usage: prefill_in_ram.sh DIR
# (DIR holds qwen3moe-12l-16e.gguf and q4.waste). With WASTE_OLD=<binary of an earlier
# revision>, that binary's GGUF and q4 rows run beside the others in the same rounds.
B=$HOME/.cache/waste-ci-target/release/waste
L=/var/tmp/waste-peers/llama.cpp-0.3.36/build/bin/llama-bench
cd "${1:-/work/m}"
cat qwen3moe-12l-16e.gguf > /dev/null
echo "load at start: $(cat /proc/loadavg)"
for round in 1 2; do
  for n in 512 2048; do
    echo "$round $n llama-default $($L -m qwen3moe-12l-16e.gguf -p $n -n 0 -t 2 -r 1 --repack 0 -o csv 2>/dev/null | tail -1 | awk -F, '{print $(NF-1)}')"
    echo "$round $n llama-b$n $($L -m qwen3moe-12l-16e.gguf -p $n -n 0 -t 2 -r 1 --repack 0 -b $n -ub $n -o csv 2>/dev/null | tail -1 | awk -F, '{print $(NF-1)}')"
    echo "$round $n waste-gguf $($B bench qwen3moe-12l-16e.gguf --prefill $n --ctx $((n+16)) --budget 4G --threads 2 2>&1 | grep -o '[0-9.]* tok/s' | head -1)"
    echo "$round $n waste-q4 $($B bench q4.waste --prefill $n --ctx $((n+16)) --budget 4G --threads 2 2>&1 | grep -o '[0-9.]* tok/s' | head -1)"
    if [ -n "$WASTE_OLD" ]; then
      echo "$round $n waste-gguf-old $($WASTE_OLD bench qwen3moe-12l-16e.gguf --prefill $n --ctx $((n+16)) --budget 4G --threads 2 2>&1 | grep -o '[0-9.]* tok/s' | head -1)"
      echo "$round $n waste-q4-old $($WASTE_OLD bench q4.waste --prefill $n --ctx $((n+16)) --budget 4G --threads 2 2>&1 | grep -o '[0-9.]* tok/s' | head -1)"
    fi
  done
done
echo "load at end: $(cat /proc/loadavg)"
