package main

import "syscall"

// childProcAttr makes a started paymentsd die with idemstorm (SIGKILL when
// its parent exits), so that an interrupted storm leaves no server behind.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
