// Package conf loads and checks streamd's configuration file, reporting
// every problem with its file, line and key. It runs nothing: the daemon,
// the pipe stage and check-config all load through it.
//
// [Load] reads a TOML file: global keys (state_dir, shutdown_timeout,
// commit_interval), a [log] and a [metrics] table, [[stream]] tables for
// the stream files and [[subscription]] tables, each with a
// [subscription.handler]. configs/streamd.toml documents every key at its
// default. The same file is read for streamd run ([ModeRun]) and checked
// by streamd check-config; streamd pipe ([ModePipe]) reads stdin instead
// of stream files, keeps no state, and needs each subscription to name
// out_retry, where its retry copies go on stdout.
//
// Checking is strict. Keys are matched exactly (case-sensitively); an
// unknown key, a value of the wrong type, a bare integer where a duration
// string such as "5s" is wanted, a key the mode does not use: each is an
// error. All problems are reported at once, one per line, written
// "file:line: key: problem" with the key's path, such as
// subscription[1].handler.url.
//
// Relative paths in the file (state_dir, stream paths, bearer_token_file,
// ca_file, an exec command containing a slash) are taken from the
// directory of the configuration file, not the working directory, and
// [Load] returns them absolute. When state_dir is not set, it is
// $STATE_DIRECTORY, which systemd sets from StateDirectory=.
package conf
