#!/usr/bin/env bash
# make install into a scratch root, twice, with the configuration edited in
# between: the edit must be kept and the example installed beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
conf="$root/etc/streamd/streamd.toml"
fail() { echo "install test: $*" >&2; exit 1; }

make -s install DESTDIR="$root" >/dev/null
cmp -s configs/streamd.toml "$conf" || fail "$conf is not the example"
[ "$(stat -c %a "$conf")" = 640 ] || fail "$conf has mode $(stat -c %a "$conf"), want 640"
want=root
getent group streamd >/dev/null && want=streamd
[ "$(stat -c %G "$conf")" = "$want" ] || fail "$conf has group $(stat -c %G "$conf"), want $want"

echo '# edited by the operator' >>"$conf"
edited=$(sha256sum <"$conf")
out=$(make -s install DESTDIR="$root")
[ "$(sha256sum <"$conf")" = "$edited" ] || fail "the second install overwrote the edited $conf"
cmp -s configs/streamd.toml "$conf.dist" || fail "the second install did not put the example at $conf.dist"
grep -q "streamd.toml exists and is kept; the example is $conf.dist" <<<"$out" || fail "the second install did not say where the example went: $out"
echo ">> make install keeps an edited configuration"
