package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/testutil"
)

// Scratch IDs of the shared-files test: a producers' group and two users
// in it, the daemon and a producer. They need no entry in /etc/passwd.
const (
	sharedGID   = 64970
	daemonUID   = 64971
	producerUID = 64972
)

// TestSharedStreamFile: a stream file streamd creates in a setgid
// directory of the producers' group, with file_mode = "0660", gets that
// group and mode (whatever the umask), and another member of the group
// appends to it with streamd publish.
func TestSharedStreamFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the test runs the daemon and the producer as scratch users: run the tests as root")
	}
	dir := t.TempDir()
	os.Chmod(filepath.Dir(dir), 0o755)
	os.Chmod(dir, 0o755)
	shared := filepath.Join(dir, "seastreamer")
	state := filepath.Join(dir, "state")
	for _, d := range []struct {
		path     string
		uid, gid int
		mode     os.FileMode
	}{{shared, 0, sharedGID, 0o770 | os.ModeSetgid}, {state, daemonUID, daemonUID, 0o750}} {
		if err := os.Mkdir(d.path, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d.path, d.uid, d.gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d.path, d.mode); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(streamdBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "streamd") // where the scratch users may run it
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	stream := filepath.Join(shared, "orders.ss")
	config := filepath.Join(dir, "streamd.toml")
	writeConfig(t, config, fmt.Sprintf("state_dir = %q\n[metrics]\nlisten = \"\"\n[[stream]]\nname = \"orders\"\npath = %q\nfile_mode = \"0660\"\n"+
		"[[subscription]]\nname = \"billing\"\nstream = \"orders\"\nkey = \"orders\"\n[subscription.handler]\nkind = \"stdout\"\nformat = \"ndjson\"\n", state, stream))

	daemon := exec.Command(bin, "run", "--config.file="+config)
	daemon.Env = quickExit()
	var out, errOut testutil.SyncBuffer
	daemon.Stdout, daemon.Stderr = &out, &errOut
	daemon.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: daemonUID, Gid: daemonUID, Groups: []uint32{sharedGID}}}
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { daemon.Process.Kill(); daemon.Wait() }()
	var st syscall.Stat_t
	eventually(t, 10*time.Second, "the daemon creates "+stream, func() bool { return syscall.Stat(stream, &st) == nil && st.Size > 0 })
	if st.Mode&0o7777 != 0o660 || st.Gid != sharedGID || st.Uid != daemonUID {
		t.Fatalf("%s: uid %d gid %d mode %04o, want uid %d gid %d mode 0660; daemon stderr:\n%s", stream, st.Uid, st.Gid, st.Mode&0o7777, daemonUID, sharedGID, errOut.String())
	}

	publish := exec.Command(bin, "publish", "--file="+stream, "--key=orders")
	publish.Env = quickExit()
	publish.Stdin = bytes.NewReader([]byte(`{"from":"producer"}` + "\n"))
	publish.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: producerUID, Gid: producerUID, Groups: []uint32{sharedGID}}}
	if msg, err := publish.CombinedOutput(); err != nil {
		t.Fatalf("publish as another member of the group: %v: %s", err, msg)
	}
	defer func() {
		if t.Failed() {
			t.Logf("daemon stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
		}
	}()
	eventually(t, 10*time.Second, "the daemon delivers the producer's record", func() bool {
		return strings.Contains(out.String(), `"payload_b64":"eyJmcm9tIjoicHJvZHVjZXIifQ=="`) // {"from":"producer"}
	})
}
