//go:build !linux

package supervise

import "syscall"

// childProcAttr: no parent-death signal outside Linux.
func childProcAttr() *syscall.SysProcAttr { return nil }
