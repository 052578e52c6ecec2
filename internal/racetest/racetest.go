// Package racetest releases many goroutines on one call at once, for the
// tests of claim races, which count the winners. It imports nothing but the
// standard library, so that the conformance suite (idemdrivertest) can use
// it without the test databases' drivers.
package racetest

import (
	"errors"
	"sync"
)

// Race calls f from n goroutines released together, waits for all of them,
// and returns the results of the calls that succeeded (in no order) and the
// errors of the others, joined (nil when none failed). f(i) is call i, i in
// [0, n).
func Race[T any](n int, f func(i int) (T, error)) ([]T, error) {
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		results []T
		errs    []error
		start   = make(chan struct{})
	)
	for i := range n {
		wg.Go(func() {
			<-start
			res, err := f(i)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			results = append(results, res)
		})
	}
	close(start)
	wg.Wait()
	return results, errors.Join(errs...)
}
