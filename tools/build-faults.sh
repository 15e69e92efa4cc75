#!/usr/bin/env bash
# Build the drills' fault tools into DEST (default .venv/bin):
#   hac-lazyfs       the FUSE layer of the power-loss family (tools/faults/lazyfs.c);
#                    needs libfuse3's headers: as root on Debian it installs them
#                    (libfuse3-dev, fuse3) with apt-get
#   libhac-clock.so  the LD_PRELOAD shim of the clock family (tools/faults/clock.c)
# Each is built on its own; one that cannot be built is named in one line (exit 1) and
# its family is skipped by the drills with the reason.
set -uo pipefail
dest=${1:-.venv/bin}
here=$(cd "$(dirname "$0")" && pwd)
cc=${CC:-cc}
status=0
mkdir -p "$dest"

fresh() { [ -e "$1" ] && [ "$1" -nt "$2" ]; }

if ! command -v "$cc" >/dev/null; then
    echo "build-faults: no C compiler ($cc): power-loss and clock drills will skip" >&2
    exit 1
fi

src="$here/faults/clock.c"
out="$dest/libhac-clock.so"
if ! fresh "$out" "$src"; then
    if "$cc" -O2 -Wall -Wextra -Werror -shared -fPIC -o "$out.tmp" "$src" -ldl; then
        mv "$out.tmp" "$out"
    else
        echo "build-faults: libhac-clock.so did not build: clock drills will skip" >&2
        status=1
    fi
fi

src="$here/faults/lazyfs.c"
out="$dest/hac-lazyfs"
if ! fresh "$out" "$src"; then
    if ! pkg-config --exists fuse3 2>/dev/null && [ "$(id -u)" = 0 ] \
        && command -v apt-get >/dev/null; then
        install() {
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                libfuse3-dev fuse3 pkg-config >/dev/null 2>&1
        }
        install || { apt-get update -qq >/dev/null 2>&1 && install; }
    fi
    if ! pkg-config --exists fuse3 2>/dev/null; then
        echo "build-faults: libfuse3-dev is not installed (as root: apt-get install" \
            "libfuse3-dev): power-loss drills will skip" >&2
        status=1
    # shellcheck disable=SC2046
    elif "$cc" -O2 -Wall -Wextra -Werror -o "$out.tmp" "$src" $(pkg-config --cflags --libs fuse3); then
        mv "$out.tmp" "$out"
    else
        echo "build-faults: hac-lazyfs did not build: power-loss drills will skip" >&2
        status=1
    fi
fi
exit $status
