package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/envelope"
	"github.com/streamd/streamd/internal/failpoint"
	"github.com/streamd/streamd/offsets"
	"github.com/streamd/streamd/retrytimer"
	"github.com/streamd/streamd/streamfile"
)

// The crash tests kill the daemon with SIGKILL while it works and check
// DESIGN.md Invariants 1 to 4 from the outside: through the delivery log
// the exec handler writes, the stream file, the sidecar and the spool.
//
// An exec handler runs in a process group of its own, so it outlives a
// kill -9 of the daemon: the handlers of a killed daemon may still write
// to the delivery log afterwards, and one started just before the kill may
// find its stdin closed before the payload was written. Their log lines
// carry the daemon's pid ($PPID) so that such lines can be told apart.

// stateDirPath is the env's state directory (see writeConfig).
func (e *env) stateDirPath() string { return filepath.Join(e.dir, "state") }

// kill9 kills the daemon with SIGKILL and waits until it is reaped, so
// that its locks are released. It fails the test if the daemon had already
// exited on its own: a restart after a crash must not fail.
func (p *daemonProc) kill9(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
		t.Fatalf("the daemon exited on its own (%s) before it was killed; stderr:\n%s", p.cmd.ProcessState, p.stderr.String())
	default:
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// problems returns what the daemon's log shows that must never happen: a
// data race, a panic, an error logged, or a reader that found damage in
// the stream file. Only flock'd writers append to the files of the crash
// tests, so the only damage a crash can leave is a torn tail, which a
// reader waits on and the next append truncates: a reader that reports a
// corrupt frame, or a file changed under it, read that repair wrongly.
func (p *daemonProc) crashProblems() []string {
	var out []string
	s := p.stderr.String()
	for _, bad := range []string{"WARNING: DATA RACE", "panic:", "fatal error:", "level=ERROR",
		"corrupt frame", "skipped damaged bytes", "stream file was truncated", "stream file was rewritten",
		"stored position does not fit"} {
		if n := strings.Count(s, bad); n > 0 {
			out = append(out, fmt.Sprintf("%d × %q in the daemon's log", n, bad))
		}
	}
	return out
}

// waitOrphans waits until the delivery log has not changed for 300 ms (at
// most 5 s): the handlers of a killed daemon must not write into the
// test's directory while it is removed.
func (e *env) waitOrphans() {
	last, stable := int64(-1), time.Now()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var size int64
		if fi, err := os.Stat(e.log); err == nil {
			size = fi.Size()
		}
		if size != last {
			last, stable = size, time.Now()
		} else if time.Since(stable) >= 300*time.Millisecond {
			return
		}
	}
}

// deliveryLine is one line of the delivery log: "seq attempt payload pid".
type deliveryLine struct {
	seq     uint64
	attempt uint64
	payload string
	pid     int // of the daemon that ran the handler
}

// parseDeliveries parses the delivery log lines of the handlers of these tests.
// Each line is one O_APPEND write; with strict, a malformed line fails the
// test, otherwise it is left out (for polling).
func parseDeliveries(t *testing.T, lines []string, strict bool) []deliveryLine {
	t.Helper()
	out := make([]deliveryLine, 0, len(lines))
	for _, l := range lines {
		f := strings.Fields(l)
		var err error
		var seq, attempt uint64
		var pid int
		if len(f) != 4 {
			err = errors.New("want 4 fields")
		} else {
			var err1, err2, err3 error
			seq, err1 = strconv.ParseUint(f[0], 10, 64)
			attempt, err2 = strconv.ParseUint(f[1], 10, 64)
			pid, err3 = strconv.Atoi(f[3])
			err = errors.Join(err1, err2, err3)
		}
		switch {
		case err == nil:
			out = append(out, deliveryLine{seq, attempt, f[2], pid})
		case strict:
			t.Fatalf("delivery log line %q: %v", l, err)
		}
	}
	return out
}

// scanFrames decodes the stream file as far as it is complete, without
// failing on a frame being written: for polling while writers run. The
// final checks use readFile, which verifies the whole file.
func scanFrames(path string) []streamfile.Record {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	h, err := streamfile.ReadHeader(f)
	if err != nil {
		return nil
	}
	d := streamfile.NewDecoder(f, h, streamfile.HeaderSize)
	var recs []streamfile.Record
	for {
		r, err := d.Next()
		if err != nil {
			return recs
		}
		rec := *r
		rec.Payload = bytes.Clone(r.Payload)
		recs = append(recs, rec)
	}
}

// spoolPending opens the spool of a stopped daemon's state directory and
// returns how many copies it holds.
func spoolPending(t *testing.T, dir string) int {
	t.Helper()
	q, err := retrytimer.Open(retrytimer.Options{Dir: dir, Fire: func(context.Context, retrytimer.Copy) error {
		return errors.New("only counting")
	}})
	if err != nil {
		t.Fatalf("open the spool: %v", err)
	}
	defer q.Close()
	return q.Pending()
}

// crashHeaders are the headers of the producer's records. Copies and
// dead letters must keep them (spec/settlement.md §4.2).
var crashHeaders = envelope.Headers{{Name: "x-producer", Value: []byte("crash")}}

// crashProducer appends records with unique payloads to a stream file from a
// goroutine, through a streamfile.Writer of its own: flock'd appends like
// those of streamd publish (Invariant 4), racing the daemon's copies.
type crashProducer struct {
	w     *streamfile.Writer
	stop  chan struct{}
	done  chan struct{}
	pause sync.Mutex // held by the test to hold appends back
	count int        // records published; read after done
	err   error      // read after done
}

// newCrashProducer creates the stream file and publishes the first records, so
// that the file exists before any daemon starts.
func newCrashProducer(t *testing.T, path string, first int) *crashProducer {
	t.Helper()
	w, err := streamfile.OpenWriter(path, streamfile.CreateOptions{
		Create: true,
		Header: streamfile.Header{FileName: filepath.Base(path), CreatedAtMs: uint64(time.Now().UnixMilli()), BeaconInterval: 1024},
	})
	if err != nil {
		t.Fatal(err)
	}
	p := &crashProducer{w: w, stop: make(chan struct{}), done: make(chan struct{})}
	if err := p.publish(first); err != nil {
		t.Fatal(err)
	}
	return p
}

// publish appends n records in one batch: payloads p-<number> in an
// envelope with crashHeaders.
func (p *crashProducer) publish(n int) error {
	frames := make([]streamfile.Frame, n)
	for i := range frames {
		payload := envelope.Encode(crashHeaders, fmt.Appendf(nil, "p-%d", p.count+i), false)
		frames[i] = streamfile.Frame{Key: "orders", TimestampMs: uint64(time.Now().UnixMilli()), Payload: payload}
	}
	if err := p.w.Publish(frames); err != nil {
		return err
	}
	p.count += n
	return nil
}

// run publishes 1 to 3 records every 15 to 45 ms until stop is closed.
func (p *crashProducer) run(rng *rand.Rand) {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			p.err = p.w.Close()
			return
		case <-time.After(time.Duration(15+rng.IntN(31)) * time.Millisecond):
		}
		p.pause.Lock()
		err := p.publish(1 + rng.IntN(3))
		p.pause.Unlock()
		if err != nil {
			p.err = errors.Join(err, p.w.Close())
			return
		}
	}
}

// The outcome of payload p-n in TestCrashKill9 is decided by n mod 4.
const (
	crashAck        = 0 // exit 0
	crashDrop       = 1 // exit 65 (EX_DATAERR)
	crashRetryAfter = 2 // retry_after=150ms: a copy through the durable spool
	crashRetry      = 3 // outcome=retry: a copy appended at once
)

// crashSub answers by the payload number only, so that every delivery of a
// record (original, copy, or repeat after a crash) gets the same outcome;
// under max_attempts = 3 a retry payload ends as a dead letter. Once it has
// decided, and before it answers and exits, it logs "seq attempt payload
// pid" with one O_APPEND write (see concurrencySub for why there). An
// empty payload (stdin closed by a dying daemon) is logged "-".
const crashSub = `
[[subscription]]
name = "billing"
stream = "orders"
key = "orders"
concurrency = 4
max_attempts = 3
dead_letter = "orders.dead"
backoff = ["100ms"]
[subscription.handler]
kind = "exec"
timeout = "10s"
command = ["/bin/sh", "-c", '''
IFS= read -r p
n=${p#p-}
out= code=0
[ $(( ${n:-0} % 37 )) = 0 ] && sleep 0.15
case $(( ${n:-0} % 4 )) in
1) code=65 ;;
2) out=retry_after=150ms ;;
3) out=outcome=retry ;;
esac
echo "$STREAMD_SEQ $STREAMD_ATTEMPT ${p:--} $PPID" >> LOG
[ -z "$out" ] || echo "$out"
exit $code
''']
`

// crashRun is one run of the daemon in TestCrashKill9.
type crashRun struct {
	pid   int
	from  int64  // the stored offset it resumed at: the sidecar after the previous kill; 0 before the first commit
	point string // the failpoint that killed it; "" for a kill from outside, or for the last run
	hit   int    // the armed hit of point
}

// crashPointHits bounds the hit a failpoint of TestCrashKill9 is armed at
// (1 to the bound, at random), by how often the daemon passes the point
// under the producer's load: an append per copy or dead letter, a spool
// record per delayed copy scheduled or fired, a commit per 100 ms.
var crashPointHits = map[string]int{
	failpoint.StreamfileAppend: 30,
	failpoint.OffsetsWrite:     10,
	failpoint.OffsetsCommit:    10,
	failpoint.RetrytimerSpool:  30,
}

// awaitFailpoint waits until the daemon killed itself at point: it died of
// SIGKILL, having said so on stderr. It fails the test if the daemon is
// still running after timeout, or died another way.
func (p *daemonProc) awaitFailpoint(t *testing.T, point string, hit int, timeout time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		t.Fatalf("failpoint %s=%d not reached within %s; stderr:\n%s", point, hit, timeout, p.stderr.String())
	}
	ws, _ := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("armed at %s=%d, the daemon exited with %s; stderr:\n%s", point, hit, p.cmd.ProcessState, p.stderr.String())
	}
	if want := fmt.Sprintf("failpoint: %s: hit %d:", point, hit); !strings.Contains(p.stderr.String(), want) {
		t.Fatalf("the daemon died of SIGKILL without %q on stderr:\n%s", want, p.stderr.String())
	}
}

// TestCrashKill9 kills the daemon with SIGKILL while a producer appends and
// the handler acks, drops, retries and retries after a delay, restarts it
// after each kill, lets it finish, and audits what the crashes left:
// Invariants 1 to 4, and the retry chain of spec/settlement.md §4 under
// max_attempts = 3 with a dead letter.
//
// Most kills come from outside at a random instant. The others come from
// inside, at a failpoint (internal/failpoint) armed at a random hit, in
// the middle of an operation: a torn append to the stream file, a torn
// temporary sidecar, a complete one not yet renamed, a torn spool record.
// After each kill, the sidecar's stored position is read, and the audit
// checks that the next run redelivers nothing before it: repeats come only
// from the commit window.
//
// The records carry a header (which copies and dead letters must keep);
// TestConcurrencyCrash covers plain records under concurrency > 1.
//
// STREAMD_TORTURE_KILLS sets the number of kills from outside (make
// torture runs 100; 4 by default, 2 with -short),
// STREAMD_TORTURE_POINT_KILLS the number at each failpoint (make torture
// runs 5; 1 by default).
func TestCrashKill9(t *testing.T) {
	t.Parallel()
	kills, pointKills := 4, 1
	if testing.Short() {
		kills = 2
	}
	for _, v := range []struct {
		name string
		n    *int
	}{{"STREAMD_TORTURE_KILLS", &kills}, {"STREAMD_TORTURE_POINT_KILLS", &pointKills}} {
		if s := os.Getenv(v.name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				t.Fatalf("%s=%q: want a number of kills", v.name, s)
			}
			*v.n = n
		}
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))

	// The kills in a random order: "" from outside, or a failpoint.
	plan := make([]string, kills, kills+pointKills*len(failpoint.Points))
	for _, point := range failpoint.Points {
		for range pointKills {
			plan = append(plan, point)
		}
	}
	rng.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })

	e := newEnv(t, crashSub)
	t.Cleanup(e.waitOrphans)
	prod := newCrashProducer(t, e.stream, 20)
	go prod.run(rand.New(rand.NewPCG(seed, 2)))
	stopProducer := sync.OnceFunc(func() { close(prod.stop); <-prod.done })
	defer stopProducer()

	start := time.Now()
	var committed int          // records before the stored position, summed over the kills
	var resume int64           // the stored offset the next run resumes at; 0 before the first commit
	var runs []crashRun        // in order; run i ended with kill i
	tornTails, tmpLeft := 0, 0 // torn stream tails and temporary sidecars found at failpoint kills
	// After a torn append, the producer is held back until the next run
	// has been up for a while, so that the torn tail is still there when
	// it starts: its reader reaches it and waits, and its own next append
	// repairs it (truncates, then writes) under the reader.
	holding := false
	release := func() {
		if holding {
			holding = false
			time.AfterFunc(time.Duration(200+rng.IntN(401))*time.Millisecond, prod.pause.Unlock)
		}
	}
	for _, point := range plan {
		run := crashRun{from: resume, point: point}
		var p *daemonProc
		if point == "" {
			p = e.start()
			release()
			time.Sleep(time.Duration(50+rng.IntN(351)) * time.Millisecond)
			p.kill9(t)
		} else {
			run.hit = 1 + rng.IntN(crashPointHits[point])
			p = e.startWith(nil, fmt.Sprintf("%s=%s=%d", failpoint.EnvVar, point, run.hit))
			release()
			p.awaitFailpoint(t, point, run.hit, 30*time.Second)
			switch point {
			case failpoint.StreamfileAppend:
				prod.pause.Lock()
				holding = true
				// The producer may have repaired it already.
				if recs := scanFrames(e.stream); len(recs) > 0 {
					if fi, err := os.Stat(e.stream); err == nil && fi.Size() > recs[len(recs)-1].End {
						tornTails++
					}
				}
			case failpoint.OffsetsWrite, failpoint.OffsetsCommit:
				if _, err := os.Stat(filepath.Join(e.stateDirPath(), offsets.SidecarName+".tmp")); err != nil {
					t.Errorf("killed at %s: no temporary sidecar left: %v", point, err)
				} else {
					tmpLeft++
				}
			}
		}
		run.pid = p.cmd.Process.Pid
		runs = append(runs, run)
		// Invariant 1 at the instant of the kill: the stored position
		// passes only records whose handler had finished. It is read after
		// the daemon died: where the next run resumes.
		snapshot := parseDeliveries(t, e.deliveries(), true)
		if pos, before, ok := checkSettledPrefix(t, e, scanFrames(e.stream), snapshot, false); ok {
			committed += before
			resume = pos.Offset
		}
		for _, problem := range p.crashProblems() {
			t.Errorf("run killed after %s: %s", time.Since(start).Round(time.Millisecond), problem)
		}
	}
	killing := time.Since(start)
	if holding {
		prod.pause.Unlock()
	}
	stopProducer()
	if prod.err != nil {
		t.Fatalf("producer: %v", prod.err)
	}
	records := prod.count

	// Let the daemon finish: every record delivered, every retry chain at
	// its dead letter, and then nothing written for a second (the retry
	// delay is 150ms: no copy can still be due).
	p := e.start()
	runs = append(runs, crashRun{pid: p.cmd.Process.Pid, from: resume})
	var lastLog, lastFrames int
	quietSince := time.Now()
	var missing string // what the last look found missing
	defer func() {
		if t.Failed() && missing != "" {
			t.Logf("at the end: %s (%d records)", missing, records)
		}
	}()
	// Each look reads the delivery log and the whole stream file: four a
	// second leave the cores to the daemon, which may have thousands of
	// handler processes to start.
	eventuallyEvery(t, 3*time.Minute, 250*time.Millisecond, "the daemon to deliver everything and go quiet", func() bool {
		lines, recs := e.deliveries(), scanFrames(e.stream)
		if len(lines) != lastLog || len(recs) != lastFrames {
			lastLog, lastFrames, quietSince = len(lines), len(recs), time.Now()
			return false
		}
		missing = crashMissing(records, parseDeliveries(t, lines, false), recs)
		return time.Since(quietSince) >= time.Second && missing == ""
	})
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit code %d after the last run", code)
	}
	for _, problem := range p.crashProblems() {
		t.Errorf("last run: %s", problem)
	}

	a := auditCrash(t, e, records, runs)
	t.Logf("audit: %d records, %d kills in %s (stored positions checked at each: %d records behind them in all), "+
		"%d deliveries (%d repeated, %d cut off by a kill before the payload arrived), "+
		"%d retry copies (%d repeated), %d dead letters (%d repeated), %d records in the file",
		records, len(plan), killing.Round(time.Millisecond), committed, a.deliveries, a.duplicates, a.interrupted,
		a.copies, a.extraCopies, a.deadLetters, a.extraDead, a.frames)

	// Kills and redeliveries by point.
	type byPoint struct{ kills, redelivered, max int }
	points := map[string]*byPoint{}
	names := append([]string{""}, failpoint.Points...)
	for _, name := range names {
		points[name] = &byPoint{}
	}
	worst := 0
	var perKill strings.Builder
	for i, n := range a.redelivered {
		bp := points[runs[i].point]
		bp.kills++
		bp.redelivered += n
		bp.max = max(bp.max, n)
		if n > a.redelivered[worst] {
			worst = i
		}
		fmt.Fprintf(&perKill, " %d", n)
	}
	var kinds []string
	for _, name := range names {
		bp := points[name]
		label := name
		if name == "" {
			label = "outside"
		}
		kinds = append(kinds, fmt.Sprintf("%s %d (redelivered %d, at most %d after one)", label, bp.kills, bp.redelivered, bp.max))
	}
	t.Logf("audit: kills by point: %s; at failpoint kills: %d of %d torn appends still on disk at the kill, %d of %d temporary sidecars left",
		strings.Join(kinds, ", "), tornTails, points[failpoint.StreamfileAppend].kills, tmpLeft,
		points[failpoint.OffsetsWrite].kills+points[failpoint.OffsetsCommit].kills)
	if len(a.redelivered) > 0 {
		how := "outside"
		if runs[worst].point != "" {
			how = fmt.Sprintf("%s=%d", runs[worst].point, runs[worst].hit)
		}
		t.Logf("audit: originals redelivered after each kill, none before the stored position: max %d (kill %d, %s), %d in all; per kill:%s",
			a.redelivered[worst], worst+1, how, a.duplicatesAfterKills, perKill.String())
	}
}

// crashMissing returns what is missing before the crash test is done: ""
// when every record p-0 to p-<records-1> was delivered and every retry
// payload has its dead letter, or the first record that was not, or has
// none.
func crashMissing(records int, lines []deliveryLine, recs []streamfile.Record) string {
	first := make(map[string]bool)
	for _, l := range lines {
		if l.attempt == 1 {
			first[l.payload] = true
		}
	}
	dead := make(map[string]bool)
	for _, r := range recs {
		if r.Key == "orders.dead" {
			_, p := envelope.Decode(r.Payload)
			dead[string(p)] = true
		}
	}
	for n := range records {
		payload := fmt.Sprintf("p-%d", n)
		if !first[payload] {
			return payload + " was never delivered"
		}
		if m := n % 4; (m == crashRetry || m == crashRetryAfter) && !dead[payload] {
			return payload + " has no dead letter"
		}
	}
	return ""
}

// crashAudit is what auditCrash counted.
type crashAudit struct {
	frames                 int
	deliveries, duplicates int
	interrupted            int
	copies, extraCopies    int
	deadLetters, extraDead int
	// redelivered[i] counts the originals that the run after kill i
	// delivered again (an earlier run had delivered them);
	// duplicatesAfterKills is their sum.
	redelivered          []int
	duplicatesAfterKills int
}

// auditCrash checks the state TestCrashKill9 left after its clean stop.
// runs are the daemon's runs in order, each with the stored offset it
// resumed at; the last one ended cleanly. Lines with an empty payload, from
// handlers a killed daemon started but did not feed, are counted apart.
//
// A line from a killed run counts as a delivery although that run did not
// settle it: the handler (in a process group of its own) ran to its
// decision, so its work was done. Whether the daemon committed past
// records it had not settled is checked at each kill instead
// (checkSettledPrefix).
func auditCrash(t *testing.T, e *env, records int, runs []crashRun) crashAudit {
	t.Helper()
	var a crashAudit
	lastPid := runs[len(runs)-1].pid
	runIndex := make(map[int]int, len(runs)) // pid → index in runs
	for i, r := range runs {
		runIndex[r.pid] = i
	}

	// The file decodes cleanly: every frame's checksum and every beacon
	// (streamfile.Verify, in readFile), and no torn tail after a clean
	// stop.
	frames := e.frames()
	a.frames = len(frames)
	// The sidecar loads and has the subscription's position in this file.
	positions, err := offsets.Load(e.stateDirPath())
	if err != nil {
		t.Fatalf("sidecar: %v", err)
	}
	pos, ok := positions["billing"]
	if !ok || pos.Stream != e.stream {
		t.Fatalf("sidecar: no position for billing in %s: %+v", e.stream, positions)
	}
	if fi, _ := os.Stat(e.stream); pos.Offset != fi.Size() {
		t.Errorf("sidecar offset %d after a clean stop of a quiet daemon, want the end of the file, %d", pos.Offset, fi.Size())
	}
	// Nothing is left in the spool: every delayed copy fired.
	if n := spoolPending(t, e.stateDirPath()); n != 0 {
		t.Errorf("%d copies still pending in the spool after the daemon went quiet", n)
	}

	// The file by sequence of the orders key, and the copies and dead
	// letters of each payload.
	type frameInfo struct {
		payload string
		count   uint64 // retry count, 0 for an original
	}
	bySeq := map[uint64]frameInfo{}
	originals := map[string]int{}
	copies := map[string]map[uint64]int{} // payload → retry count → copies
	dead := map[string][]uint64{}         // payload → retry counts of its dead letters
	for _, f := range frames {
		h, payload := envelope.Decode(f.Payload)
		if f.Key == "orders" || f.Key == "orders.dead" {
			if v, _ := h.Get("x-producer"); string(v) != "crash" {
				t.Errorf("%s seq %d (%s) lost the producer's header: %v", f.Key, f.Seq, payload, h)
			}
		}
		switch f.Key {
		case "orders":
			c := envelope.RetryCount(h)
			bySeq[f.Seq] = frameInfo{string(payload), c}
			if c == 0 {
				originals[string(payload)]++
				continue
			}
			if copies[string(payload)] == nil {
				copies[string(payload)] = map[uint64]int{}
			}
			copies[string(payload)][c]++
			a.copies++
			if origin, _ := h.Get("x-streamd-origin"); string(origin) != "billing" {
				t.Errorf("copy seq %d of %s: x-streamd-origin %q, want billing", f.Seq, payload, origin)
			}
		case "orders.dead":
			dead[string(payload)] = append(dead[string(payload)], envelope.RetryCount(h))
			a.deadLetters++
		case "ruststream-internal":
		default:
			t.Errorf("unexpected key %q in the stream file", f.Key)
		}
	}

	// Where each record of the key ends, for the resume check below.
	ends := map[uint64]int64{}
	for _, r := range scanFrames(e.stream) {
		if r.Key == "orders" {
			ends[r.Seq] = r.End
		}
	}

	// Each delivery is of a record in the file, as the file has it, and
	// no run delivered a record before the position it resumed at, the
	// sidecar as the kill before it left it: a restart repeats at most what
	// was settled after the last commit (Invariant 1), the commit window.
	// Lines whose $PPID is not a run (the handler started after its daemon
	// died and was adopted) are not attributed.
	attempts := map[string]map[uint64]int{}
	originalRuns := map[uint64]map[int]bool{} // seq of an original → runs that delivered it
	var early []string
	for _, l := range parseDeliveries(t, e.deliveries(), true) {
		if l.payload == "-" {
			if l.pid == lastPid {
				t.Errorf("delivery %+v: empty payload from a daemon that was not killed", l)
			}
			a.interrupted++
			continue
		}
		a.deliveries++
		i, attributed := runIndex[l.pid]
		if attributed && i > 0 && ends[l.seq] <= runs[i].from {
			how := "from outside"
			if k := runs[i-1]; k.point != "" {
				how = fmt.Sprintf("at %s=%d", k.point, k.hit)
			}
			early = append(early, fmt.Sprintf("after kill %d (%s), run %d delivered seq %d (%s, attempt %d), which ends at %d, before the stored offset %d it resumed at",
				i, how, i+1, l.seq, l.payload, l.attempt, ends[l.seq], runs[i].from))
		}
		if attributed && l.attempt == 1 {
			if originalRuns[l.seq] == nil {
				originalRuns[l.seq] = map[int]bool{}
			}
			originalRuns[l.seq][i] = true
		}
		fi, ok := bySeq[l.seq]
		switch {
		case !ok:
			t.Errorf("delivery %+v: no record with that sequence under orders", l)
			continue
		case fi.payload != l.payload || fi.count+1 != l.attempt:
			t.Errorf("delivery %+v: the file has payload %q with retry count %d at that sequence", l, fi.payload, fi.count)
		}
		if attempts[l.payload] == nil {
			attempts[l.payload] = map[uint64]int{}
		}
		attempts[l.payload][l.attempt]++
	}

	// A hard failure: a record before the stored position came back.
	if len(early) > 0 {
		t.Fatalf("%d deliveries of records before the stored position their run resumed at, outside the commit window:\n%s",
			len(early), strings.Join(early[:min(len(early), 10)], "\n"))
	}
	// Originals delivered again after each kill: by a run, having been
	// delivered by an earlier one.
	a.redelivered = make([]int, len(runs)-1)
	for _, byRun := range originalRuns {
		first := len(runs)
		for i := range byRun {
			first = min(first, i)
		}
		for i := range byRun {
			if i > first {
				a.redelivered[i-1]++
				a.duplicatesAfterKills++
			}
		}
	}

	expected := 0
	for n := range records {
		payload := fmt.Sprintf("p-%d", n)
		if originals[payload] != 1 {
			t.Errorf("%s: %d originals in the file, want 1", payload, originals[payload])
		}
		// Invariant 1: every record was delivered, at least once.
		if attempts[payload][1] == 0 {
			t.Errorf("%s: never delivered (attempts %v)", payload, attempts[payload])
		}
		switch n % 4 {
		case crashAck, crashDrop:
			expected++
			if len(copies[payload]) != 0 || len(dead[payload]) != 0 {
				t.Errorf("%s (ack or drop): copies %v, dead letters %v, want none", payload, copies[payload], dead[payload])
			}
			if len(attempts[payload]) != 1 {
				t.Errorf("%s (ack or drop): attempts %v, want attempt 1 only", payload, attempts[payload])
			}
		case crashRetry, crashRetryAfter:
			expected += 3
			// The chain is complete: attempts 1, 2 and 3, copies with retry
			// counts 1 and 2, and a dead letter with count 3, never more
			// attempts. It is not exactly one of each, because a crash can
			// repeat a link: a record whose copy (or dead letter) was
			// appended, but whose position was not committed yet when the
			// daemon died, is delivered again after the restart and makes
			// a second copy (or dead letter); a delayed copy that fired
			// just before the crash, before the spool's done record was
			// written, fires again. Each repeat runs the rest of the chain
			// again. That is at least once (Invariant 1), so: at least one.
			if len(attempts[payload]) != 3 || attempts[payload][1] == 0 || attempts[payload][2] == 0 || attempts[payload][3] == 0 {
				t.Errorf("%s (retry): attempts %v, want 1, 2 and 3", payload, attempts[payload])
			}
			if len(copies[payload]) != 2 || copies[payload][1] == 0 || copies[payload][2] == 0 {
				t.Errorf("%s (retry): copies by retry count %v, want counts 1 and 2", payload, copies[payload])
			}
			a.extraCopies += max(copies[payload][1]-1, 0) + max(copies[payload][2]-1, 0)
			if len(dead[payload]) == 0 {
				t.Errorf("%s (retry): no dead letter under orders.dead", payload)
			}
			for _, c := range dead[payload] {
				if c != 3 {
					t.Errorf("%s (retry): dead letter with retry count %d, want 3", payload, c)
				}
			}
			a.extraDead += max(len(dead[payload])-1, 0)
		}
	}
	if len(originals) != records {
		t.Errorf("%d distinct originals in the file, want the %d published", len(originals), records)
	}
	a.duplicates = a.deliveries - expected
	return a
}

// concurrencySub handles record seq n with a latency of (n*37 mod 51)
// ms, and every 16th record 400 ms more, longer than the commit interval,
// so that records finish out of order under concurrency = 8 and a slow one
// is in flight across commits and kills; it logs
// "seq attempt payload pid" as the last thing before it exits 0. A payload
// other than c-<seq> is logged as mismatch(len=N).
//
// The line is written after the work and before the exit on purpose: the
// daemon settles a record only after its handler process exited, and a
// commit stores only the end of a settled prefix. So a record's line is in
// the log before the record is settled, and every record before a stored
// offset has its line, provided the log is read after the commit: after
// the kill, as the sidecar is. A line written when the handler starts
// would only prove that the delivery began, and could not catch a position
// stored past a record still being handled. (A handler of the killed
// daemon can still log after the kill, but its record was not settled, so
// it could hide a violation only by finishing between the kill and the
// read of the log.)
const concurrencySub = `
[[subscription]]
name = "billing"
stream = "orders"
key = "orders"
concurrency = 8
[subscription.handler]
kind = "exec"
timeout = "10s"
command = ["/bin/sh", "-c", '''
IFS= read -r p
ms=$(( STREAMD_SEQ * 37 % 51 + (STREAMD_SEQ % 16 == 0) * 400 ))
sleep 0.$(( ms / 100 ))$(( ms / 10 % 10 ))$(( ms % 10 ))
case $p in
"c-$STREAMD_SEQ") ;;
*) p="mismatch(len=${#p})" ;;
esac
echo "$STREAMD_SEQ $STREAMD_ATTEMPT $p $PPID" >> LOG
''']
`

// TestConcurrencyCrash kills the daemon with SIGKILL while 8 handlers run
// at once and finish out of order, and checks after each kill that the
// stored position does not pass a record that was not settled (Invariant
// 1: the end of the longest fully settled prefix); then that a restart
// delivers every record at least once, each with its own payload. It runs
// with records in an envelope with a header (the daemon decodes each
// payload into a buffer of its own) and with plain records, whose payload
// the reader must copy before a worker gets it (up to 7ed40a0 it did not:
// workers were handed bytes the reader had overwritten, a data race).
func TestConcurrencyCrash(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		header []string
	}{
		{"envelope", []string{"--header=x-producer=test"}},
		{"plain", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, concurrencySub)
			t.Cleanup(e.waitOrphans)
			const n = 120
			var in strings.Builder
			for i := range n {
				fmt.Fprintf(&in, "c-%d\n", i+1)
			}
			r := runBinary(t, []byte(in.String()), append([]string{"publish", "--file=" + e.stream, "--key=orders", "--beacon-interval=1024"}, tc.header...)...)
			if r.code != 0 {
				t.Fatalf("publish: %s", r.stderr)
			}
			// A record of another key at the end, passed over by billing.
			if r := runBinary(t, []byte("a-1\n"), "publish", "--file="+e.stream, "--key=audit"); r.code != 0 {
				t.Fatalf("publish: %s", r.stderr)
			}
			recs := scanFrames(e.stream)
			var problems []string
			note := func(s string) { problems = append(problems, s) }

			for _, at := range []int{40, 80} {
				p := e.start()
				eventually(t, 30*time.Second, fmt.Sprintf("%d deliveries", at), func() bool { return len(e.deliveries()) >= at })
				p.kill9(t)
				// The log as it was at the kill.
				snapshot := parseDeliveries(t, e.deliveries(), true)
				for _, s := range p.crashProblems() {
					note(s)
				}
				pos, before, ok := checkSettledPrefix(t, e, recs, snapshot, true)
				if !ok || before == 0 {
					t.Fatalf("nothing committed after %d records were handled (commit_interval is 100ms): the check proved nothing", len(snapshot))
				}
				t.Logf("killed with %d records handled, %d of them before the stored offset %d (last_seq %d)", len(snapshot), before, pos.Offset, pos.LastSeq)
			}

			p := e.start()
			eventually(t, 30*time.Second, "every record delivered", func() bool {
				seen := map[uint64]bool{}
				for _, l := range parseDeliveries(t, e.deliveries(), false) {
					seen[l.seq] = true
				}
				return len(seen) == n
			})
			if code := p.stop(t); code != 0 {
				note(fmt.Sprintf("exit code %d after SIGTERM", code))
			}
			for _, s := range p.crashProblems() {
				note(s)
			}
			got := parseDeliveries(t, e.deliveries(), true)
			count := map[uint64]int{}
			cutOff := 0
			for _, l := range got {
				if l.payload == "mismatch(len=0)" && l.pid != p.cmd.Process.Pid {
					cutOff++ // stdin closed by the kill before the payload was written
					continue
				}
				count[l.seq]++
				if l.attempt != 1 {
					t.Errorf("delivery %+v: attempt %d, want 1 (every record is acked)", l, l.attempt)
				}
				if want := fmt.Sprintf("c-%d", l.seq); l.payload != want {
					note(fmt.Sprintf("seq %d was handed payload %s, want %s", l.seq, l.payload, want))
				}
			}
			for seq := uint64(1); seq <= n; seq++ {
				if count[seq] == 0 {
					t.Errorf("seq %d never delivered", seq)
				}
			}
			final := readFile(t, e.stream)
			positions, err := offsets.Load(e.stateDirPath())
			if err != nil {
				t.Fatal(err)
			}
			fi, _ := os.Stat(e.stream)
			pos := positions["billing"]
			if pos.Offset != fi.Size() {
				t.Errorf("after the clean stop: stored offset %d, want the end of the file, %d", pos.Offset, fi.Size())
			}
			t.Run("last_seq", func(t *testing.T) {
				// The audit record after the n is passed over: it settles
				// at once and must carry the last_seq of the last record of
				// the key (offsets.Position.LastSeq, shown by streamd
				// offsets show).
				if pos.LastSeq != n {
					t.Errorf("stored last_seq %d after every record up to seq %d settled and a frame of another key (%d frames in the file)",
						pos.LastSeq, n, len(final))
				}
			})
			t.Logf("%d records, %d deliveries over 3 runs (%d repeated, %d cut off by a kill)", n, len(got)-cutOff, len(got)-cutOff-n, cutOff)
			if len(problems) > 0 {
				t.Errorf("%d problems: %s", len(problems), strings.Join(problems[:min(len(problems), 5)], "; "))
			}
		})
	}
}

// checkSettledPrefix checks the sidecar of a killed daemon against the
// delivery log read after the kill: every record of the key that ends at or
// before the stored offset was handled to completion, and the offset is the
// end of a record; with strictSeq, last_seq is the sequence of the last
// record of the key before it. It returns the position and the number of
// records of the key before it; ok is false when none is stored yet.
func checkSettledPrefix(t *testing.T, e *env, recs []streamfile.Record, snapshot []deliveryLine, strictSeq bool) (pos offsets.Position, before int, ok bool) {
	t.Helper()
	positions, err := offsets.Load(e.stateDirPath())
	if err != nil {
		t.Fatalf("sidecar after kill -9: %v", err)
	}
	if pos, ok = positions["billing"]; !ok {
		return pos, 0, false
	}
	// Handled: the handler logged, whatever payload it was given, except
	// an empty one: the daemon died before it wrote the payload, so it
	// cannot have settled the record.
	done := map[uint64]bool{}
	for _, l := range snapshot {
		if l.payload != "-" && l.payload != "mismatch(len=0)" {
			done[l.seq] = true
		}
	}
	boundary := pos.Offset == streamfile.HeaderSize
	var lastSeq uint64
	for _, r := range recs {
		if r.End == pos.Offset {
			boundary = true
		}
		if r.End > pos.Offset || r.Key != "orders" {
			continue
		}
		before++
		lastSeq = r.Seq
		if !done[r.Seq] {
			t.Errorf("stored offset %d passes seq %d (ends at %d), which had not been handled when the daemon was killed", pos.Offset, r.Seq, r.End)
		}
	}
	if !boundary {
		t.Errorf("stored offset %d is not the end of a record", pos.Offset)
	}
	if strictSeq && pos.LastSeq != lastSeq {
		t.Errorf("stored last_seq %d, but the last record before offset %d is seq %d", pos.LastSeq, pos.Offset, lastSeq)
	}
	return pos, before, true
}

// TestTornAppendRepaired kills the daemon at the failpoint streamfile.append
// while it appends a retry copy, which leaves a torn tail: the first bytes
// of the copy's frame and nothing more. The next run reads up to the torn
// tail and waits there; then another writer (streamd publish) appends,
// which first truncates the torn bytes and then writes its own frames in
// their place, and appends more a little later. The waiting reader must
// deliver the new records exactly as the file has them (sequence,
// timestamp, payload), report no damage, and lose nothing.
func TestTornAppendRepaired(t *testing.T) {
	t.Parallel()
	for round := range 3 {
		t.Run(fmt.Sprintf("round%d", round), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			arm := filepath.Join(dir, "arm")
			e := newEnv(t, execSubTable("billing", "orders", "max_attempts = 3", fmt.Sprintf(`IFS= read -r p
echo "$STREAMD_SEQ $STREAMD_ATTEMPT $p $STREAMD_TIMESTAMP_MS $PPID" >> LOG
if [ "$p" = tear ] && [ -e %q ]; then echo outcome=retry; fi`, arm)))
			e.publish("a", "b", "tear")
			if err := os.WriteFile(arm, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			p := e.startWith(nil, failpoint.EnvVar+"="+failpoint.StreamfileAppend+"=1")
			p.awaitFailpoint(t, failpoint.StreamfileAppend, 1, 20*time.Second)
			recs := scanFrames(e.stream)
			fi, err := os.Stat(e.stream)
			if err != nil || len(recs) == 0 || fi.Size() <= recs[len(recs)-1].End {
				t.Fatalf("no torn tail after the kill (%v); stderr:\n%s", err, p.stderr.String())
			}
			t.Logf("torn tail of %d bytes after the last frame, at %d", fi.Size()-recs[len(recs)-1].End, recs[len(recs)-1].End)

			// The next run acks everything: nothing it does repairs the tail.
			if err := os.Remove(arm); err != nil {
				t.Fatal(err)
			}
			q := e.start()
			pid := strconv.Itoa(q.cmd.Process.Pid)
			eventually(t, 20*time.Second, "the next run to deliver the torn copy's record", func() bool {
				for _, l := range e.deliveries() {
					if f := strings.Fields(l); len(f) == 5 && f[2] == "tear" && f[4] == pid {
						return true
					}
				}
				return false
			})
			time.Sleep(300 * time.Millisecond) // its reader waits at the torn tail
			e.publish("after-1", "after-2", "after-3")
			time.Sleep(300 * time.Millisecond)
			var more []string
			for i := 4; i <= 20; i++ {
				more = append(more, fmt.Sprintf("after-%d", i))
			}
			e.publish(more...)

			want := map[string]streamfile.Record{}
			for _, r := range scanFrames(e.stream) {
				_, payload := envelope.Decode(r.Payload)
				want[string(payload)] = r
			}
			eventually(t, 10*time.Second, "the records published after the repair to be delivered", func() bool {
				n := 0
				for _, l := range e.deliveries() {
					if f := strings.Fields(l); len(f) == 5 && strings.HasPrefix(f[2], "after-") {
						n++
					}
				}
				return n >= 20
			})
			if code := q.stop(t); code != 0 {
				t.Errorf("exit code %d", code)
			}
			for _, problem := range q.crashProblems() {
				t.Errorf("the run after the torn append: %s", problem)
			}
			for _, l := range e.deliveries() {
				f := strings.Fields(l)
				if len(f) != 5 || f[4] != pid {
					continue
				}
				r, ok := want[f[2]]
				if !ok || f[0] != strconv.FormatUint(r.Seq, 10) || f[3] != strconv.FormatUint(r.TimestampMs, 10) {
					t.Errorf("delivered seq %s payload %q timestamp %s; the file has seq %d timestamp %d for that payload (found %v)",
						f[0], f[2], f[3], r.Seq, r.TimestampMs, ok)
				}
			}
			e.frames() // the file decodes cleanly
		})
	}
}

// TestKillBeforeFirstCommitAtEnd: a subscription's first start at
// start_at = "end" commits where it starts before it reads. Killed (-9)
// with a record in flight, long before its first commit_interval ends, it
// delivers that record again after the restart, instead of applying
// start_at again at the end the record moved past.
func TestKillBeforeFirstCommitAtEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t, lifecycleSub("late", "orders", `start_at = "end"`, `[ "$STREAMD_ATTEMPT" = 1 ] && [ ! -e LOG.restarted ] && sleep 60`))
	e.editConfig(`commit_interval = "100ms"`, `commit_interval = "1h"`)
	e.publish("old-1", "old-2")
	p := e.start()
	eventually(t, 20*time.Second, "the daemon to run", func() bool { return p.logCount("streamd running") == 1 })
	e.publish("new-1")
	eventually(t, 20*time.Second, "new-1 to be handed to the handler", func() bool {
		return slices.Contains(e.deliveries(), "late 3 1 new-1 start")
	})
	p.kill9(t)
	if err := os.WriteFile(e.log+".restarted", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	q := e.start()
	eventually(t, 20*time.Second, "new-1 to be delivered after the restart", func() bool {
		return slices.Contains(e.deliveries(), "late 3 1 new-1 end")
	})
	if code := q.stop(t); code != 0 {
		t.Errorf("exit code %d", code)
	}
	for _, l := range e.deliveries() {
		if strings.Contains(l, "old-") {
			t.Errorf("delivered %q, from before the end the subscription started at", l)
		}
	}
}
