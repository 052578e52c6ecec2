package supervise

import "syscall"

// childProcAttr makes a child die with its parent (SIGKILL when the parent
// exits), so that an interrupted storm or test run leaves no server behind.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
