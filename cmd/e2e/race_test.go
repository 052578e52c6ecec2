//go:build race

package e2e

// raceEnabled: this test binary runs with the race detector, and so do the
// binaries it builds.
const raceEnabled = true
