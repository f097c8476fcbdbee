#!/bin/sh
# Installs the Debian 12 packages autoreply builds and tests with (run as root).
# Skips apt entirely when everything is already there, so it is cheap to call every time.
set -e
PKGS="build-essential pkg-config clang libclang-rt-14-dev curl
libmicrohttpd-dev libsqlite3-dev libpcre2-dev libcjson-dev libmsgpack-dev libcmocka-dev
libpq-dev libhiredis-dev librabbitmq-dev zlib1g-dev
postgresql redis-server rabbitmq-server nginx-light prometheus iproute2 procps"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "installing:$missing"
if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: need root to install:$missing" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# packaged servers must not start system-wide instances: the tests start their own
[ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d; }
apt-get install -y -qq --no-install-recommends $missing
