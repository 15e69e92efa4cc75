#!/usr/bin/env bash
# Installs the official RocketMQ 5 Java SDK (rocketmq-client-java, a version pinned
# below with its sha256; tests/sdk_java/pom.xml names the artifact) that
# tests/integration/test_java_sdk.py drives through `hactl proxy`.
#
#   bash tools/install-java-sdk.sh [DIR [VERSION]]
#
# DIR defaults to .venv/sdk-java, VERSION to 5.0.8, the SDK of the suite. `make tools`
# also installs 5.2.0 into .venv/sdk-java-5.2.0: 5.0.8 has no priority messages
# (MessageBuilder.setPriority came with 5.2.0, and 5.0.8 cannot read a PRIORITY topic's
# route), so the priority scenario runs on 5.2.0.
#
# `mvn dependency:copy-dependencies` into DIR/lib, with Maven's repository in
# ${HAC_TOOLS_CACHE:-$XDG_CACHE_HOME/ha-controller or ~/.cache/ha-controller}/m2, so a
# fresh clone on the same machine does not download it again. Idempotent: when DIR was
# installed from the same pom.xml it does nothing. The scenarios are compiled by the test
# (javac), not here. When it cannot install (no java, javac or mvn, Maven Central
# unreachable, a jar of another sha256) it exits 1 and writes the one-line reason to
# DIR/../java-sdk-unavailable, which the tests show when they skip; a successful run
# removes that file.
set -euo pipefail

SDK="rocketmq-client-java"
SDK_VERSION="${2:-5.0.8}"
case "$SDK_VERSION" in
  5.0.8) SDK_SHA256="29a46f937f17723c9927d1e46aa1e62d117d8add0bda0e9d5114fc145c5b2c12" ;;
  5.2.0) SDK_SHA256="059c33d9db713302f27d5a6e85bf6648821d14a098a81c844f171e572b532112" ;;
  *) echo "install-java-sdk: no sha256 pinned for $SDK@$SDK_VERSION" >&2; exit 2 ;;
esac

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SRC="$ROOT/tests/sdk_java"
DIR="${1:-$ROOT/.venv/sdk-java}"
mkdir -p "$DIR" && DIR="$(cd "$DIR" && pwd)"
CACHE_DIR="${HAC_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ha-controller}"
if [ "$SDK_VERSION" = 5.0.8 ]; then
  MARKER="$(dirname "$DIR")/java-sdk-unavailable"
else
  MARKER="$(dirname "$DIR")/java-sdk-$SDK_VERSION-unavailable"
fi
JAR="$SDK-$SDK_VERSION.jar"

unavailable() {
  local reason="$*"
  mkdir -p "$(dirname "$MARKER")"
  printf '%s\n' "$reason" >"$MARKER"
  echo "install-java-sdk: $reason" >&2
  exit 1
}

sha_ok() {
  local got
  got="$(sha256sum "$1" | cut -d' ' -f1)"
  [ "$got" = "$SDK_SHA256" ]
}

for tool in java javac; do
  command -v "$tool" >/dev/null 2>&1 \
    || unavailable "$tool is not installed, so $SDK@$SDK_VERSION cannot run (apt-get install openjdk-17-jdk-headless)"
done

if [ -f "$DIR/pom.xml" ] && cmp -s "$SRC/pom.xml" "$DIR/pom.xml" && [ -f "$DIR/lib/$JAR" ] \
    && sha_ok "$DIR/lib/$JAR"; then
  rm -f "$MARKER"
  echo "install-java-sdk: $SDK@$SDK_VERSION already in $DIR"
  exit 0
fi

command -v mvn >/dev/null 2>&1 \
  || unavailable "mvn is not installed, so $SDK@$SDK_VERSION cannot be fetched (apt-get install maven)"
mkdir -p "$CACHE_DIR/m2"
rm -rf "$DIR/lib.new" "$DIR/pom.xml"
log="$CACHE_DIR/mvn-java-sdk-$SDK_VERSION.log"
echo "install-java-sdk: mvn dependency:copy-dependencies $SDK@$SDK_VERSION into $DIR"
if ! mvn -q -B -f "$SRC/pom.xml" "-Dmaven.repo.local=$CACHE_DIR/m2" "-Dsdk.version=$SDK_VERSION" \
    dependency:copy-dependencies "-DoutputDirectory=$DIR/lib.new" >"$log" 2>&1; then
  why="$(grep -m1 '^\[ERROR\]' "$log" | cut -c1-200 || true)"
  unavailable "mvn could not fetch $SDK@$SDK_VERSION (${why:-see $log}; is Maven Central reachable?)"
fi
[ -f "$DIR/lib.new/$JAR" ] || unavailable "mvn did not copy $JAR into $DIR"
sha_ok "$DIR/lib.new/$JAR" || unavailable "$JAR from Maven Central has another sha256 than its pin"
rm -rf "$DIR/lib"
mv "$DIR/lib.new" "$DIR/lib"
cp "$SRC/pom.xml" "$DIR/pom.xml"
rm -f "$MARKER"
echo "install-java-sdk: installed $SDK@$SDK_VERSION into $DIR"
