package handler

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"syscall"
)

// runGroup runs cmd, made by exec.CommandContext, in a process group of
// its own that dies with the daemon. When cmd's context ends, the whole
// group is killed with SIGKILL, so nothing the command started outlives
// it; when the daemon dies, even by kill -9, the kernel kills the command
// (Pdeathsig), so that it is not left reading a payload cut short.
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
	return cmd.Run()
}
