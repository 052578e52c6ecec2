package dbtest

import "github.com/idemgo/idem/internal/racetest"

// Race calls f from n goroutines released together, waits for all of them,
// and returns the results of the calls that succeeded (in no order) and the
// errors of the others, joined (nil when none failed). For claim races, whose
// tests count the winners; racetest.Race is the same with the call's index.
func Race[T any](n int, f func() (T, error)) ([]T, error) {
	return racetest.Race(n, func(int) (T, error) { return f() })
}
