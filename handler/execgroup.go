package handler

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// runGroup runs cmd, made by exec.CommandContext, in a process group of
// its own that dies with the daemon. When cmd's context ends, the whole
// group is killed with SIGKILL, so nothing the command started outlives
// it; when the daemon dies, even by kill -9, the kernel kills the command
// (Pdeathsig), so that it is not left reading a payload cut short; when it
// exits without a stop (KillCommands), the whole group is killed.
//
// The kernel sends Pdeathsig when the thread that forked the child ends,
// not the process (go.dev/issue/27505), so the calling goroutine keeps its
// thread, and no other goroutine may end it, until the command has exited.
func runGroup(cmd *exec.Cmd) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error {
		err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		if errors.Is(err, syscall.ESRCH) {
			return os.ErrProcessDone
		}
		return err
	}
	if err := groups.start(cmd); err != nil {
		return err
	}
	defer groups.remove(cmd)
	return cmd.Wait()
}

// groups is the process groups of the commands running.
var groups = runningGroups{cmds: make(map[*exec.Cmd]struct{})}

// runningGroups is the process groups of the exec commands running, for
// KillCommands. Commands start under the read lock, so that KillCommands,
// under the write lock, finds every command started and none starts
// after it.
type runningGroups struct {
	mu     sync.RWMutex
	cmds   map[*exec.Cmd]struct{} // each leads a group of its own
	killed bool                   // KillCommands ran: nothing starts any more
	mapMu  sync.Mutex             // guards cmds under the read lock
}

// errExiting is the error of a command not started because the daemon
// exits (KillCommands).
var errExiting = errors.New("not started: streamd exits")

// start starts cmd and records its process group.
func (g *runningGroups) start(cmd *exec.Cmd) error {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.killed {
		return errExiting
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	g.mapMu.Lock()
	g.cmds[cmd] = struct{}{}
	g.mapMu.Unlock()
	return nil
}

func (g *runningGroups) remove(cmd *exec.Cmd) {
	g.mapMu.Lock()
	delete(g.cmds, cmd)
	g.mapMu.Unlock()
}

// KillCommands kills the process group of every exec command running, and
// keeps any from starting, for a daemon that exits without waiting for
// them (a second stop signal): the kernel's parent-death signal reaches
// each command, but not what the command started.
func KillCommands() {
	groups.mu.Lock()
	defer groups.mu.Unlock()
	groups.killed = true
	groups.mapMu.Lock()
	defer groups.mapMu.Unlock()
	for cmd := range groups.cmds {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
