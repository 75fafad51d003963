// Package durable holds the file mechanisms that streamd's on-disk state
// relies on to survive a crash, in one place:
//
//   - [Replace] swaps a file's content atomically and durably: a temporary
//     file in the same directory is written, fsynced and renamed over the
//     file, and the directory is fsynced. A crash at any instant leaves the
//     old content or the new one, never a mix. The offsets sidecar and the
//     retry spool (created, and rewritten by compaction) use it.
//   - [SyncDir] makes the entries of a directory (a rename, a new file)
//     durable.
//   - [Lock], [TryLock] and [Unlock] take and release flock(2) locks,
//     resuming a wait that a signal interrupted (EINTR). Stream file writers
//     and readers coordinate appends under them, and a state directory is
//     held by one process at a time with one.
//
// flock locks belong to the open file description: two opens of one file
// in the same process conflict as two processes do, and the kernel drops a
// lock when its holder dies.
package durable
