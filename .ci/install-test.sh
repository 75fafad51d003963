#!/usr/bin/env bash
# make install into a scratch root, twice, with the configuration edited in
# between: the edit must be kept and the example installed beside it. Then
# with PREFIX=/usr: the unit must run the streamd installed there, and make
# uninstall must remove everything but the configuration.
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

usr=$(mktemp -d)
trap 'rm -rf "$root" "$usr"' EXIT
make -s install DESTDIR="$usr" PREFIX=/usr >/dev/null
unit="$usr/etc/systemd/system/streamd.service"
[ -x "$usr/usr/bin/streamd" ] || fail "PREFIX=/usr did not install $usr/usr/bin/streamd"
[ "$(stat -c %a "$unit")" = 644 ] || fail "$unit has mode $(stat -c %a "$unit"), want 644"
grep -q '^ExecStart=/usr/bin/streamd run ' "$unit" || fail "with PREFIX=/usr, $unit does not run /usr/bin/streamd: $(grep ^Exec "$unit")"
! grep -q /usr/local/ "$unit" || fail "with PREFIX=/usr, $unit still names /usr/local: $(grep /usr/local/ "$unit")"
out=$(make -s uninstall DESTDIR="$usr" PREFIX=/usr)
left=$(cd "$usr" && find . -type f | sort)
[ "$left" = "./etc/streamd/streamd.toml" ] || fail "make uninstall left other files than the configuration: $left"
grep -q "kept: $usr/etc/streamd/" <<<"$out" || fail "make uninstall did not say the configuration stays: $out"
echo ">> make install keeps an edited configuration, its unit runs the streamd of PREFIX, and make uninstall keeps only the configuration"
