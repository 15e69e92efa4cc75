#!/usr/bin/env bash
# Installs the official RocketMQ Node.js SDK (rocketmq-client-nodejs, pinned with its
# whole dependency tree by tests/sdk_node/package.json and package-lock.json) that
# tests/integration/test_node_sdk.py drives through `hactl proxy`, and TypeScript's tsc
# (a dev dependency there), which tests/integration/test_official_examples.py compiles
# the SDK's own .ts examples with.
#
#   bash tools/install-node-sdk.sh [DIR]        (default: .venv/sdk-node; `make tools` runs it)
#
# `npm ci` into DIR/node_modules, with npm's download cache in
# ${HAC_TOOLS_CACHE:-$XDG_CACHE_HOME/ha-controller or ~/.cache/ha-controller}/npm, so a
# fresh clone on the same machine does not download it again. Idempotent: when DIR was
# installed from the same package-lock.json it does nothing. No package install script
# is run (--ignore-scripts: the SDK needs none). When it cannot install (no node or npm,
# registry unreachable) it exits 1 and writes the one-line reason to
# DIR/../node-sdk-unavailable, which the tests show when they skip; a successful run
# removes that file.
set -euo pipefail

SDK="rocketmq-client-nodejs"
SDK_VERSION="1.0.8"
NODE_MAJOR_MIN=18

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SRC="$ROOT/tests/sdk_node"
DIR="${1:-$ROOT/.venv/sdk-node}"
# absolute: node's require() reads a relative path as a package name
mkdir -p "$DIR" && DIR="$(cd "$DIR" && pwd)"
CACHE_DIR="${HAC_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ha-controller}"
MARKER="$(dirname "$DIR")/node-sdk-unavailable"

unavailable() {
  local reason="$*"
  mkdir -p "$(dirname "$MARKER")"
  printf '%s\n' "$reason" >"$MARKER"
  echo "install-node-sdk: $reason" >&2
  exit 1
}

installed_version() {
  node -e 'try { console.log(require(process.argv[1]).version) } catch (e) { console.log("") }' \
    "$DIR/node_modules/$SDK/package.json" 2>/dev/null || true
}

command -v node >/dev/null 2>&1 || unavailable "node is not installed, so $SDK@$SDK_VERSION cannot run"
major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$major" -ge "$NODE_MAJOR_MIN" ] \
  || unavailable "node $(node --version) is older than v$NODE_MAJOR_MIN, which $SDK@$SDK_VERSION needs"

if [ -f "$DIR/package-lock.json" ] && cmp -s "$SRC/package-lock.json" "$DIR/package-lock.json" \
    && [ "$(installed_version)" = "$SDK_VERSION" ]; then
  rm -f "$MARKER"
  echo "install-node-sdk: $SDK@$SDK_VERSION already in $DIR"
  exit 0
fi

command -v npm >/dev/null 2>&1 || unavailable "npm is not installed, so $SDK@$SDK_VERSION cannot be fetched"
mkdir -p "$DIR" "$CACHE_DIR/npm"
cp "$SRC/package.json" "$SRC/package-lock.json" "$DIR/"
log="$CACHE_DIR/npm-ci-node-sdk.log"
echo "install-node-sdk: npm ci $SDK@$SDK_VERSION into $DIR"
if ! (cd "$DIR" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error \
    --cache "$CACHE_DIR/npm" --prefer-offline --fetch-retries=1 --fetch-timeout=60000 \
    >/dev/null 2>"$log"); then
  rm -f "$DIR/package-lock.json"  # not installed: the next run tries again
  why="$(grep -m1 '^npm error' "$log" | sed 's/^npm error //' || true)"
  unavailable "npm ci $SDK@$SDK_VERSION failed (${why:-see $log}; is the npm registry reachable?)"
fi
[ "$(installed_version)" = "$SDK_VERSION" ] \
  || unavailable "npm ci did not install $SDK@$SDK_VERSION into $DIR"
rm -f "$MARKER"
echo "install-node-sdk: installed $SDK@$SDK_VERSION into $DIR"
