// Package daemon runs streamd's subscriptions: it follows their stream
// files (or, for a pipe stage, stdin), hands each record of a subscribed
// key to its handler, settles the outcome as spec/settlement.md describes
// (retry copies, the cap, the dead letter), and commits each
// subscription's position past the longest settled prefix of its records.
//
// Each subscription reads its file ahead of its handling, on a goroutine
// of its own (readahead.go), so that checking the frames and handling the
// records can run on two cores while a subscription catches up.
//
// [Daemon] is `streamd run`: it opens the configured stream files, the
// positions sidecar and the durable retry spool, starts one subscription
// per [[subscription]], reloads on request, and stops within the shutdown
// timeout. A stream file that cannot be opened or read holds back only the
// subscriptions of its stream, which wait for it, reported unhealthy; the
// spool marks the state directory as used, so a sidecar missing next to it
// is refused rather than taken for a first start. [RunPipe] is `streamd pipe`: the same delivery path and
// settlement over stdio lines, with copies written to stdout and nothing
// stored.
//
// Byte formats live elsewhere (streamfile, envelope, pipe); handlers in
// package handler; the configuration in package conf.
package daemon
