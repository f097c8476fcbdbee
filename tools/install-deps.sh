#!/bin/sh
# Installs the Debian 12 packages autoreply builds and tests with (run as root).
# Skips apt entirely when everything is already there, so it is cheap to call every time.
set -e
PKGS="build-essential pkg-config clang libclang-rt-14-dev curl
libmicrohttpd-dev libsqlite3-dev libpcre2-dev libcjson-dev libmsgpack-dev libcmocka-dev
libpq-dev libhiredis-dev librabbitmq-dev zlib1g-dev
postgresql redis-server rabbitmq-server nginx-light prometheus iproute2 procps
chromium fonts-wqy-microhei nodejs"
# The browser tests' driver (tests/browser: playwright-core, pinned by its package-lock.json)
# drives Debian's /usr/bin/chromium: npm downloads no browser. Installed again only when the
# lock file changed since the last install.
browser_deps() {
    command -v npm >/dev/null 2>&1 || { echo "install-deps: npm not found (nodejs)" >&2; return 1; }
    d=tests/browser
    [ -f "$d/node_modules/.package-lock.json" ] && cmp -s "$d/package-lock.json" "$d/node_modules/.lock-installed" && return 0
    (cd "$d" && npm ci --no-audit --no-fund --loglevel=error) && cp "$d/package-lock.json" "$d/node_modules/.lock-installed" && return 0
    # the rest of the suite still runs; tests/cli/console_browser_test then fails, saying why
    echo "install-deps: npm ci in $d failed: the browser tests cannot run" >&2
    return 0
}
cd "$(dirname "$0")/.."
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# npm: Debian's own package where no npm came with the machine's Node.js (NodeSource's nodejs
# carries npm and conflicts with Debian's npm package)
command -v npm >/dev/null 2>&1 || missing="$missing npm"
if [ -z "$missing" ]; then
    browser_deps
    exit
fi
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
browser_deps
