//go:build idemfaults && !unix

package main

import "os"

// killProcess ends the process at once; without SIGKILL, os.Exit is the
// closest: no deferred function runs.
func killProcess() { os.Exit(3) }
