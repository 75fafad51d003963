// Package deploy holds, as files, what operators install next to the
// streamd binary: the systemd unit and sysusers entry (systemd/), the
// Debian package definition (deb/), the Prometheus alert rules
// (prometheus/) and the Grafana dashboard (grafana/). It has no Go code;
// its tests check the rules and the dashboard against the metrics streamd
// exports.
package deploy
