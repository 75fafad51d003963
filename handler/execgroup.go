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
	if err := cmd.Start(); err != nil {
		return err
	}
	groups.add(cmd.Process.Pid)
	defer groups.remove(cmd.Process.Pid)
	return cmd.Wait()
}

// groups is the process groups of the commands running.
var groups = runningGroups{pgids: make(map[int]struct{})}

type runningGroups struct {
	mu    sync.Mutex
	pgids map[int]struct{}
}

func (g *runningGroups) add(pgid int) {
	g.mu.Lock()
	g.pgids[pgid] = struct{}{}
	g.mu.Unlock()
}

func (g *runningGroups) remove(pgid int) {
	g.mu.Lock()
	delete(g.pgids, pgid)
	g.mu.Unlock()
}

// KillCommands kills the process group of every exec command running, for
// a daemon that exits without waiting for them (a second stop signal): the
// kernel's parent-death signal reaches each command, but not what the
// command started.
func KillCommands() {
	groups.mu.Lock()
	defer groups.mu.Unlock()
	for pgid := range groups.pgids {
		syscall.Kill(-pgid, syscall.SIGKILL)
	}
}
