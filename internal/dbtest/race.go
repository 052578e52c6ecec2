package dbtest

import (
	"errors"
	"sync"
)

// Race calls f from n goroutines released together, waits for all of them,
// and returns the results of the calls that succeeded (in no order) and the
// errors of the others, joined (nil when none failed). For claim races, whose
// tests count the winners.
func Race[T any](n int, f func() (T, error)) ([]T, error) {
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		results []T
		errs    []error
		start   = make(chan struct{})
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := f()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			results = append(results, res)
		}()
	}
	close(start)
	wg.Wait()
	return results, errors.Join(errs...)
}
