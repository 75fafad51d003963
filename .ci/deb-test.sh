#!/usr/bin/env bash
# The Debian package on this machine (run as root): build it, install it,
# check what an operator relies on, reinstall it over an edited
# configuration, and purge it. lintian runs on it when installed.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "deb test: $*" >&2; exit 1; }
conf=/etc/streamd/streamd.toml
unit=/usr/lib/systemd/system/streamd.service

if dpkg-query -W -f='${Status}' streamd 2>/dev/null | grep -q installed; then
	fail "a streamd package is installed on this machine already; remove it first"
fi
make -s deb >/dev/null
deb=$(ls -t bin/streamd_*_amd64.deb | head -1)
echo ">> $deb"
if command -v lintian >/dev/null; then
	echo ">> lintian (errors fail, warnings are listed)"
	lintian --tag-display-limit 0 "$deb" || fail "lintian found errors"
fi

dpkg-deb -f "$deb" Depends | grep -Eq '(^|, )libc6 \(>= 2\.[0-9.]+\)' || fail "the package does not depend on a libc6 version: $(dpkg-deb -f "$deb" Depends)"

dpkg -i "$deb" >/dev/null
trap 'dpkg --purge streamd >/dev/null 2>&1 || true' EXIT
/usr/bin/streamd version | grep -q '^streamd, version' || fail "/usr/bin/streamd version does not run"
getent passwd streamd >/dev/null || fail "the package did not create the streamd user"
dpkg-query -W -f='${Conffiles}\n' streamd | grep -q "^ $conf " || fail "$conf is not a conffile"
[ "$(stat -c '%U:%G %a' "$conf")" = "root:streamd 640" ] || fail "$conf is $(stat -c '%U:%G %a' "$conf"), want root:streamd 640"
setpriv --reuid=streamd --regid=streamd --init-groups /usr/bin/streamd check-config --handlers ||
	fail "check-config as the streamd user failed on the installed configuration"
out=$(systemd-analyze verify --man=no "$unit" 2>&1) || fail "systemd-analyze verify $unit: $out"
[ -z "$out" ] || fail "systemd-analyze verify $unit printed: $out"
grep -q '^ExecStart=/usr/bin/streamd run ' "$unit" || fail "$unit does not run /usr/bin/streamd"
zcat /usr/share/man/man1/streamd.1.gz | grep -q '^\.TH STREAMD 1' || fail "the package has no man page streamd(1)"
grep -q streamd /usr/share/bash-completion/completions/streamd || fail "the package has no bash completion"
[ -s /usr/share/zsh/vendor-completions/_streamd ] || fail "the package has no zsh completion"

echo '# edited by the operator' >>"$conf"
edited=$(sha256sum <"$conf")
dpkg -i "$deb" >/dev/null
[ "$(sha256sum <"$conf")" = "$edited" ] || fail "reinstalling the package overwrote the edited $conf"
[ "$(stat -c '%U:%G %a' "$conf")" = "root:streamd 640" ] || fail "after a reinstall $conf is $(stat -c '%U:%G %a' "$conf")"

dpkg --purge streamd >/dev/null
trap - EXIT
for f in /usr/bin/streamd "$unit" /usr/lib/sysusers.d/streamd.conf /etc/streamd /var/lib/streamd /var/lib/seastreamer /usr/share/doc/streamd \
	/usr/share/man/man1/streamd.1.gz /usr/share/bash-completion/completions/streamd /usr/share/zsh/vendor-completions/_streamd; do
	[ ! -e "$f" ] || fail "dpkg --purge left $f behind"
done

# A shared stream directory that was there before the package stays.
install -d -m 2775 /var/lib/seastreamer
trap 'dpkg --purge streamd >/dev/null 2>&1 || true; rmdir /var/lib/seastreamer 2>/dev/null || true' EXIT
dpkg -i "$deb" >/dev/null
dpkg --purge streamd >/dev/null
[ -d /var/lib/seastreamer ] || fail "dpkg --purge removed a /var/lib/seastreamer that was there before the package"
rmdir /var/lib/seastreamer
trap - EXIT
echo ">> the package installs, keeps an edited configuration and purges cleanly"
