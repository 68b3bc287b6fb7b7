#!/usr/bin/env bash
# A real training corpus from Debian packages, reproducibly (docs/corpus.md).
#
#   build-corpus.sh --out DIR [--slice MB] [options]   fetch, extract, collect, tokenize, check
#   build-corpus.sh --check DIR [--compare DIR2|MANIFEST] [--min-tokens N]
#   build-corpus.sh --tokenize DIR [options]           (re)tokenize DIR/text, recount, check
#   build-corpus.sh --pack DIR [--pack-dir P] [--part-size 40M]
#   build-corpus.sh --unpack P --out DIR [options]     verify, reassemble, tokenize, check
#
# Build steps (each logged with its time in DIR/build-info.json):
#   1. fetch     `apt-get download` each package (scripts/corpus/corpus.py lists them) into the
#                cache (DIR/debs, or --cache), reusing a .deb whose SHA-256 is the one apt's
#                lists give; records package, version, file and SHA-256 in DIR/debs.tsv.
#                --pin MANIFEST asks for the versions an earlier build recorded, and their SHA-256.
#   2. extract   `dpkg-deb -x` into DIR/work/<package> (removed at the end unless --keep-work).
#   3. collect   corpus.py: convert (man roff, POD, HTML -> text), drop files > 1 MB, binary or
#                not UTF-8, deduplicate by SHA-256, cap (--code-mb, --slice), split validation by
#                document hash, shuffle by hash, write DIR/text/train_NNN.jsonl, DIR/text/val.jsonl.
#   4. tokenize  `forge tokenize encode --eos-token auto` with GPT-2's and LLaMA-3's tokenizers
#                into DIR/{gpt2,llama3}/{train,val}/shard_NNNNN.bin.
#   5. manifest  token counts (from the shards) and SHA-256 of every file: DIR/manifest.json,
#                DIR/summary.md.
#   6. check     corpus.py check (every invariant; see its docstring).
#
# Options:
#   --slice MB          a small corpus of about MB megabytes from small packages only (manpages,
#                       libc6-dev), every step as the full build; what the ctest runs
#   --code-mb MB        cap on code documents (full build; default 240)
#   --cache DIR         where the .deb files are kept (default OUT/debs)
#   --forge PATH        the forge binary (default $FORGE, else `forge` on the PATH, else build/forge)
#   --tokenizers DIR    GPT-2's and LLaMA-3's tokenizer.json as DIR/gpt2/tokenizer.json and
#                       DIR/llama3/tokenizer.json (default $FORGE_TOKENIZER_FIXTURES, else
#                       .fixtures/tokenizers in the repository: scripts/fetch-tokenizer-fixtures.sh)
#   --pin MANIFEST      fetch exactly the package versions (and .deb SHA-256) of that manifest
#   --min-tokens N      check: fewer GPT-2 tokens fail (default 100000000 full, 1 slice)
#   --keep-work         keep DIR/work (the extracted packages)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=${PYTHON:-python3}
CORPUS_PY="$HERE/corpus.py"
TOKENIZER_NAMES=(gpt2 llama3)

die() { echo "build-corpus: error: $*" >&2; exit 1; }
say() { echo "build-corpus: $*"; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

MODE=build OUT="" SLICE="" CODE_MB=240 CACHE="" FORGE_BIN="${FORGE:-}" TOK_DIR="" PIN="" MIN_TOKENS=""
KEEP_WORK=0 COMPARE="" PACK_SRC="" PACK_DIR="" PART_SIZE=40M
while [ $# -gt 0 ]; do
  case "$1" in  # every option but --keep-work and --help takes a value
    --keep-work|-h|--help) ;;
    *) [ $# -ge 2 ] || die "$1 needs a value (--help lists the options)" ;;
  esac
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --slice) SLICE=$2; shift 2 ;;
    --code-mb) CODE_MB=$2; shift 2 ;;
    --cache) CACHE=$2; shift 2 ;;
    --forge) FORGE_BIN=$2; shift 2 ;;
    --tokenizers) TOK_DIR=$2; shift 2 ;;
    --pin) PIN=$2; shift 2 ;;
    --min-tokens) MIN_TOKENS=$2; shift 2 ;;
    --keep-work) KEEP_WORK=1; shift ;;
    --check) MODE=check; OUT=$2; shift 2 ;;
    --compare) COMPARE=$2; shift 2 ;;
    --tokenize) MODE=tokenize; OUT=$2; shift 2 ;;
    --pack) MODE=pack; PACK_SRC=$2; shift 2 ;;
    --pack-dir) PACK_DIR=$2; shift 2 ;;
    --part-size) PART_SIZE=$2; shift 2 ;;
    --unpack) MODE=unpack; PACK_DIR=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (--help lists the options)" ;;
  esac
done
[[ -z $SLICE || $SLICE =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--slice takes megabytes, e.g. --slice 4 (got '$SLICE')"
[[ $CODE_MB =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--code-mb takes megabytes, e.g. --code-mb 240 (got '$CODE_MB')"
[[ -z $MIN_TOKENS || $MIN_TOKENS =~ ^[0-9]+$ ]] || die "--min-tokens takes a count (got '$MIN_TOKENS')"
command -v "$PY" >/dev/null || die "python3 is missing (Debian: apt-get install python3)"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "$PY is older than Python 3.11"

# ---- helpers ------------------------------------------------------------------------------------

declare -A STEP_SECONDS=()
STEP_ORDER=()
step() {  # step NAME COMMAND...: runs it, records its wall time
  local name=$1 t0 t1; shift
  say "== $name"
  t0=$(date +%s.%N)
  "$@"
  t1=$(date +%s.%N)
  STEP_SECONDS[$name]=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  STEP_ORDER+=("$name")
  say "   $name: ${STEP_SECONDS[$name]} s"
}

find_forge() {
  if [ -n "$FORGE_BIN" ]; then
    [ -x "$FORGE_BIN" ] || die "--forge $FORGE_BIN is not an executable (build it: cmake --build build --target forge)"
  elif command -v forge >/dev/null; then
    FORGE_BIN=$(command -v forge)
  elif [ -x "$REPO/build/forge" ]; then
    FORGE_BIN="$REPO/build/forge"
  else
    die "no forge binary: give --forge PATH, put forge on the PATH, or build it (make build, or cmake --build build --target forge)"
  fi
  FORGE_BIN=$(cd "$(dirname "$FORGE_BIN")" && pwd)/$(basename "$FORGE_BIN")
}

# GPT-2's and LLaMA-3's tokenizer.json: checked before any work (find_tokenizers), then copied into
# OUT/tokenizers (install_tokenizers), so the corpus and its pack carry the exact files its shards
# were made with. A corpus that has them already (--tokenize) keeps its own.
find_tokenizers() {  # find_tokenizers [OUT's own count]
  local name own=${1:-}
  [ -n "$TOK_DIR" ] || TOK_DIR=${FORGE_TOKENIZER_FIXTURES:-$REPO/.fixtures/tokenizers}
  for name in "${TOKENIZER_NAMES[@]}"; do
    { [ -n "$own" ] && [ -f "$OUT/tokenizers/$name/tokenizer.json" ]; } || [ -f "$TOK_DIR/$name/tokenizer.json" ] \
      || die "$TOK_DIR/$name/tokenizer.json is missing: run scripts/fetch-tokenizer-fixtures.sh (or give --tokenizers DIR)"
  done
}
install_tokenizers() {
  local name
  for name in "${TOKENIZER_NAMES[@]}"; do
    [ ! -f "$OUT/tokenizers/$name/tokenizer.json" ] || continue
    mkdir -p "$OUT/tokenizers/$name"
    cp "$TOK_DIR/$name/tokenizer.json" "$OUT/tokenizers/$name/tokenizer.json"
  done
}

# OUT must be new, empty, or an earlier build of this script (marker file): nothing else is deleted.
prepare_out() {
  if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT")" ] && [ ! -f "$OUT/.forge-corpus" ]; then
    die "$OUT is not empty and not a corpus built by this script; choose a new --out directory"
  fi
  mkdir -p "$OUT"
  : > "$OUT/.forge-corpus"
  OUT=$(cd "$OUT" && pwd)
  rm -rf "$OUT/text" "$OUT/work" "$OUT/manifest.json" "$OUT/summary.md" "$OUT/documents.tsv" \
         "$OUT/debs.tsv" "$OUT/build-info.json" "$OUT/tokenizers"
  for name in "${TOKENIZER_NAMES[@]}"; do rm -rf "${OUT:?}/$name"; done
}

# ---- steps --------------------------------------------------------------------------------------

# The version and .deb SHA-256 an earlier manifest recorded for a package ("" when none).
pinned() { "$PY" - "$PIN" "$1" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for p in m["packages"]:
    if p["package"] == sys.argv[2]:
        print(p["version"], p["deb_sha256"])
PY
}

# Stale package lists (a machine whose lists predate a security update ask for a .deb the mirror
# no longer has): refresh them once, as scripts/install-deps.sh would, when this user may.
REFRESHED=0
refresh_lists() {
  [ "$REFRESHED" = 0 ] || return 1
  REFRESHED=1
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo -n true 2>/dev/null || return 1; sudo="sudo -n"; fi
  say "refreshing apt's package lists (apt-get update) once"
  $sudo apt-get update -q >/dev/null 2>&1
}

fetch() {
  local pkg spec uri file size sum have version pin_sum
  mkdir -p "$CACHE"
  : > "$OUT/debs.tsv"
  for pkg in "${PACKAGES[@]}"; do
    spec=$pkg pin_sum=""
    if [ -n "$PIN" ]; then
      read -r version pin_sum < <(pinned "$pkg") || true
      [ -n "$pin_sum" ] || die "--pin $PIN records no version of $pkg"
      spec="$pkg=$version"
    fi
    # 'URI' FILE SIZE SHA256:HEX, the candidate (or pinned) version the apt lists know.
    uri=$(apt-get download --print-uris "$spec" 2>&1 | grep "^'" | tail -1) || true
    if [ -z "$uri" ] && refresh_lists; then
      uri=$(apt-get download --print-uris "$spec" 2>&1 | grep "^'" | tail -1) || true
    fi
    if [ -z "$uri" ]; then
      die "apt-get cannot find $spec: the package lists are missing or stale (run: sudo apt-get update), or the" \
          "sources lack Debian bookworm main (/etc/apt/sources.list.d/); with --pin, the mirror may no longer have that version"
    fi
    read -r _ file size sum <<< "$uri"
    sum=${sum#SHA256:}
    [[ $sum =~ ^[0-9a-f]{64}$ ]] || die "apt-get gave no SHA-256 for $spec ($uri)"
    [ -z "$pin_sum" ] || [ "$pin_sum" = "$sum" ] || die "$spec: the mirror's .deb has SHA-256 $sum, $PIN recorded $pin_sum"
    have=""
    [ -f "$CACHE/$file" ] && have=$(sha256sum "$CACHE/$file" | cut -d' ' -f1)
    if [ "$have" != "$sum" ]; then
      say "downloading $spec ($((size / 1000)) kB)"
      rm -f "$CACHE/$file"
      (cd "$CACHE" && apt-get download -q "$spec" 2>&1 | grep -v -e '^Get:' -e 'unsandboxed' -e '^Fetched' || true)
      if [ ! -f "$CACHE/$file" ] && [ -z "$PIN" ] && refresh_lists; then  # the lists named a .deb now gone
        read -r _ file size sum <<< "$(apt-get download --print-uris "$spec" 2>&1 | grep "^'" | tail -1)"
        sum=${sum#SHA256:}
        (cd "$CACHE" && apt-get download -q "$spec" 2>&1 | grep -v -e '^Get:' -e 'unsandboxed' -e '^Fetched' || true)
      fi
      [ -f "$CACHE/$file" ] || die "apt-get download $spec did not write $CACHE/$file (network? run: sudo apt-get update)"
      have=$(sha256sum "$CACHE/$file" | cut -d' ' -f1)
      [ "$have" = "$sum" ] || die "$CACHE/$file: SHA-256 $have, apt's lists say $sum"
    else
      say "cached $file"
    fi
    version=$(dpkg-deb -f "$CACHE/$file" Version)
    printf '%s\t%s\t%s\t%s\t%s\n' "$pkg" "$version" "$file" "$sum" "$(stat -c %s "$CACHE/$file")" >> "$OUT/debs.tsv"
  done
}

extract() {
  local pkg file
  rm -rf "$OUT/work"
  mkdir -p "$OUT/work"
  while IFS=$'\t' read -r pkg _ file _ _; do
    dpkg-deb -x "$CACHE/$file" "$OUT/work/$pkg"
  done < "$OUT/debs.tsv"
}

collect() {
  local args=("$OUT" --work "$OUT/work" --debs "$OUT/debs.tsv")
  if [ -n "$SLICE" ]; then args+=(--slice "$SLICE"); else args+=(--code-mb "$CODE_MB"); fi
  "$PY" "$CORPUS_PY" collect "${args[@]}"
}

tokenize() {
  local name split files
  for name in "${TOKENIZER_NAMES[@]}"; do
    rm -rf "${OUT:?}/$name"
    for split in train val; do
      if [ "$split" = train ]; then files=("$OUT"/text/train_*.jsonl); else files=("$OUT/text/val.jsonl"); fi
      [ -f "${files[0]}" ] || die "no $split JSON Lines files in $OUT/text (run the build first)"
      mkdir -p "$OUT/$name/$split"
      "$FORGE_BIN" tokenize encode --tokenizer "$OUT/tokenizers/$name/tokenizer.json" --out "$OUT/$name/$split" \
        --eos-token auto "${files[@]}" > "$OUT/$name/$split.log" 2>&1 \
        || { cat "$OUT/$name/$split.log" >&2; die "forge tokenize encode failed ($name, $split): see above"; }
      mv "$OUT/$name/$split.log" "$OUT/$name/tokenize-$split.log"
      grep -E '^(tokenizer|every document|wrote)' "$OUT/$name/tokenize-$split.log" | sed "s/^/   $name $split: /"
    done
  done
}

manifest() {
  local args=() name
  for name in "${TOKENIZER_NAMES[@]}"; do args+=(--tokenizer "$name=$OUT/tokenizers/$name/tokenizer.json"); done
  "$PY" "$CORPUS_PY" tokens "$OUT" "${args[@]}"
}

check() {
  local min=$MIN_TOKENS args=()
  if [ -z "$min" ]; then
    if [ -f "$OUT/manifest.json" ] && grep -q '"mode": "full"' "$OUT/manifest.json"; then min=100000000; else min=1; fi
  fi
  [ -z "$COMPARE" ] || args+=(--compare "$COMPARE")
  "$PY" "$CORPUS_PY" check "$OUT" --min-tokens "$min" "${args[@]}"
}

write_build_info() {
  local t_end=$1 name steps=""
  for name in "${STEP_ORDER[@]}"; do steps+="\"$name\": ${STEP_SECONDS[$name]}, "; done
  cat > "$OUT/build-info.json" <<EOF
{"finished": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "host": "$(uname -n)", "cores": $(nproc),
 "forge": "$FORGE_BIN", "forge_version": "$("$FORGE_BIN" version 2>/dev/null | head -1 | sed 's/"/\\"/g')",
 "steps": {${steps%, }}, "total_seconds": $t_end}
EOF
  "$PY" "$CORPUS_PY" summary "$OUT"
}

# ---- modes --------------------------------------------------------------------------------------

T_START=$(date +%s)
elapsed() { echo $(( $(date +%s) - T_START )); }

case $MODE in
  build)
    [ -n "$OUT" ] || die "give --out DIR (e.g. --out /work/corpus-full, or --slice 4 --out /tmp/corpus-slice)"
    command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || die "apt-get and dpkg-deb are needed (a Debian or Ubuntu machine)"
    find_forge
    find_tokenizers
    prepare_out
    [ -n "$CACHE" ] || CACHE="$OUT/debs"
    mkdir -p "$CACHE"
    CACHE=$(cd "$CACHE" && pwd)
    install_tokenizers
    if [ -n "$SLICE" ]; then mapfile -t PACKAGES < <("$PY" "$CORPUS_PY" packages --slice)
    else mapfile -t PACKAGES < <("$PY" "$CORPUS_PY" packages); fi
    say "${SLICE:+slice of $SLICE MB: }${#PACKAGES[@]} packages (${PACKAGES[*]}) -> $OUT; forge: $FORGE_BIN"
    step fetch fetch
    step extract extract
    step collect collect
    step tokenize tokenize
    step manifest manifest
    step check check
    [ "$KEEP_WORK" = 1 ] || step cleanup rm -rf "$OUT/work"
    write_build_info "$(elapsed)"
    say "done in $(elapsed) s: $OUT/summary.md"
    ;;
  check)
    check
    ;;
  tokenize)
    [ -f "$OUT/manifest.json" ] || die "$OUT/manifest.json is missing: build the corpus (--out DIR) or unpack one (--unpack P --out DIR)"
    OUT=$(cd "$OUT" && pwd)
    find_forge
    find_tokenizers own
    install_tokenizers
    step tokenize tokenize
    step manifest manifest
    step check check
    write_build_info "$(elapsed)"
    ;;
  pack)
    # The jsonl text (with manifest.json, documents.tsv and the tokenizers) as one reproducible
    # tar, xz-compressed, cut into parts of at most --part-size, with their SHA-256 in SHA256SUMS:
    # what travels to a machine that re-tokenizes it (docs/corpus.md, "To the GPU machine").
    [ -f "$PACK_SRC/manifest.json" ] || die "$PACK_SRC/manifest.json is missing: --pack takes a built corpus directory"
    [ -n "$PACK_DIR" ] || PACK_DIR="$REPO/data/corpus/pack"
    OUT=$PACK_SRC
    check
    if [ -e "$PACK_DIR" ] && [ -n "$(ls -A "$PACK_DIR")" ] && [ ! -f "$PACK_DIR/SHA256SUMS" ]; then
      die "$PACK_DIR is not empty and holds no earlier pack (SHA256SUMS); choose another --pack-dir"
    fi
    mkdir -p "$PACK_DIR"
    rm -f "$PACK_DIR"/corpus.tar.xz.part-* "$PACK_DIR/SHA256SUMS" "$PACK_DIR/manifest.json"
    say "packing $PACK_SRC into $PACK_DIR (parts of at most $PART_SIZE)"
    t0=$(date +%s)
    (cd "$PACK_SRC" && tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu -cf - \
        manifest.json documents.tsv tokenizers text) \
      | xz -T0 -6 -c | split -b "$PART_SIZE" -d -a 3 - "$PACK_DIR/corpus.tar.xz.part-"
    cp "$PACK_SRC/manifest.json" "$PACK_DIR/manifest.json"
    (cd "$PACK_DIR" && sha256sum corpus.tar.xz.part-* manifest.json > SHA256SUMS)
    n=$(ls "$PACK_DIR"/corpus.tar.xz.part-* | wc -l)
    say "packed in $(( $(date +%s) - t0 )) s: $n part(s), $(du -cb "$PACK_DIR"/corpus.tar.xz.part-* | tail -1 | cut -f1) bytes:"
    ls -l "$PACK_DIR"
    ;;
  unpack)
    [ -n "$OUT" ] || die "give --out DIR: where to unpack"
    [ -f "$PACK_DIR/SHA256SUMS" ] || die "$PACK_DIR/SHA256SUMS is missing: --unpack takes a --pack directory"
    (cd "$PACK_DIR" && sha256sum --quiet -c SHA256SUMS) \
      || die "a part in $PACK_DIR is missing or corrupt (compare with SHA256SUMS; copy it again)"
    find_forge
    prepare_out
    say "unpacking $PACK_DIR into $OUT"
    cat "$PACK_DIR"/corpus.tar.xz.part-* | xz -d -T0 | tar -xf - -C "$OUT"
    cp "$OUT/manifest.json" "$OUT/manifest.packed.json"
    # The shards are made here again; the check then compares every file (text and shards) with
    # the manifest of the machine that packed it: the same tokens, or a failure.
    COMPARE="$OUT/manifest.packed.json"
    step tokenize tokenize
    step manifest manifest
    step check check
    write_build_info "$(elapsed)"
    say "done in $(elapsed) s: $OUT"
    ;;
esac
