#!/usr/bin/env bash
# etcd for controller mode (the automatic master switch keeps its decisions there):
# the controller tests start one member on loopback, the drills three.  From Debian's
# etcd-server package; as root with apt-get it is installed, elsewhere it must already
# be there.  The package starts a system etcd on 2379: it is stopped, the tests start
# their own on free ports.  Exit 1 (one line) when none can be had: those tests skip.
set -uo pipefail
if command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ]; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends etcd-server \
        >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null 2>&1 \
             && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                etcd-server >/dev/null 2>&1; }; then
        (systemctl stop etcd 2>/dev/null || true) >/dev/null 2>&1
        (systemctl disable etcd 2>/dev/null || true) >/dev/null 2>&1
        exit 0
    fi
fi
echo "install-etcd: no etcd (Debian: apt-get install etcd-server): the controller-mode tests will skip" >&2
exit 1
