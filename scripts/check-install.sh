#!/usr/bin/env bash
# `make install`'s result, checked (a ctest, tests/CMakeLists.txt): the build installed into a
# scratch prefix; from another directory, the installed forge runs, finds the shipped configs by
# the docs' relative names (Note [installed configs]), and installs nothing but itself and them.
#   scripts/check-install.sh BUILD_DIR
set -euo pipefail
BUILD=$(cd "$1" && pwd)
P=$(mktemp -d)
trap 'rm -rf "$P"' EXIT
cmake --install "$BUILD" --prefix "$P/prefix" > "$P/install.log"
cd "$P"
mkdir elsewhere && cd elsewhere
"$P/prefix/bin/forge" version
"$P/prefix/bin/forge" train configs/tiny.toml --print-config > "$P/config.txt"
grep -q '^name = .tiny.$' "$P/config.txt" || { echo "check-install: the installed forge did not read configs/tiny.toml"; cat "$P/config.txt"; exit 1; }
for c in gpt2-124m llama-0.85b; do "$P/prefix/bin/forge" train "configs/$c.toml" --print-config > /dev/null; done
if "$P/prefix/bin/forge" train configs/none.toml --print-config 2> "$P/err.txt"; then
  echo "check-install: a config that does not exist was read"; exit 1
fi
grep -q "config file 'configs/none.toml' does not exist" "$P/err.txt" || { cat "$P/err.txt"; exit 1; }
extra=$(cd "$P/prefix" && find . -type f | grep -v -E '^\./bin/forge$|^\./share/forge/configs/[^/]+\.toml$' || true)
[[ -z $extra ]] || { echo "check-install: installed more than forge and its configs:"; echo "$extra" | head; exit 1; }
echo "check-install: $(cd "$P/prefix" && find . -type f | wc -l) files installed; the installed forge reads configs/tiny.toml from $(pwd)"
