#!/bin/sh
# fuzz-engine.sh - builds the engine's decoder fuzz target (node pages, header
# slots, log records) and runs it for 60 s (FUZZ_SECONDS overrides).  Uses
# libFuzzer via clang when available, else a gcc ASan/UBSan build with the
# target's built-in random mutator.  Seeds come from real database files made
# by the host unit suite.  Exits non-zero if the fuzzer finds a crash.
set -eu
HERE=$(cd "$(dirname "$0")/.." && pwd)
ENGINE="$HERE/engine"
OUT="$ENGINE/build/fuzz"
SECS="${FUZZ_SECONDS:-60}"
mkdir -p "$OUT/corpus" "$OUT/scratch" "$OUT/artifacts"

make -s -C "$ENGINE" BUILD=build/fuzz/host >/dev/null
"$ENGINE/build/fuzz/host/gfe-suite" unit --junit "$OUT/seed-unit.xml" --dir "$OUT/scratch" --seed 1 >/dev/null || true

# seed corpus: selector byte + one page / header / log, from the unit suite's files
n=0
for db in "$OUT"/scratch/*.db; do
    [ -f "$db" ] || continue
    pages=$(( $(wc -c < "$db") / 4096 ))
    i=0
    while [ $i -lt "$pages" ] && [ $i -lt 40 ]; do
        for sel in 0 1; do
            { printf "\\00$sel"; dd if="$db" bs=4096 skip=$i count=1 2>/dev/null; } > "$OUT/corpus/page-$n-$i-$sel"
        done
        { printf '\002'; dd if="$db" bs=4096 skip=$i count=1 2>/dev/null; } > "$OUT/corpus/hdr-$n-$i"
        i=$((i + 1))
    done
    if [ -s "$db-wal" ]; then
        { printf '\004'; head -c 65536 "$db-wal"; } > "$OUT/corpus/wal-$n"
        { printf '\005'; tail -c +33 "$db-wal" | head -c 65536; } > "$OUT/corpus/walrec-$n"
    fi
    n=$((n + 1))
done

SRC="$ENGINE/fuzz/fuzz_decode.c $ENGINE/src/node.c"
PROBE='int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }'
if command -v clang >/dev/null 2>&1 && echo "$PROBE" | clang -fsanitize=fuzzer -x c - -o "$OUT/probe" 2>/dev/null; then
    echo "fuzz-engine: libFuzzer build (clang), ${SECS}s"
    clang -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
        -I"$ENGINE/include" -I"$ENGINE/src" $SRC -lz -o "$OUT/fuzz_decode"
    cd "$OUT"
    ./fuzz_decode -max_total_time="$SECS" -max_len=70000 -artifact_prefix="$OUT/artifacts/" -print_final_stats=1 \
        corpus
else
    echo "fuzz-engine: clang/libFuzzer not found; gcc ASan/UBSan random-mutation build, ${SECS}s"
    gcc -std=c11 -g -O1 -DFUZZ_STANDALONE -fsanitize=address,undefined -fno-sanitize-recover=undefined \
        -I"$ENGINE/include" -I"$ENGINE/src" $SRC -lz -o "$OUT/fuzz_decode"
    "$OUT/fuzz_decode" -t "$SECS" "$OUT"/corpus/*
fi
