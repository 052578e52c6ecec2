package racetest

import (
	"errors"
	"sync/atomic"
	"testing"
)

func TestRaceCallsEachIndexOnce(t *testing.T) {
	t.Parallel()
	const n = 64
	var calls [n]atomic.Int32
	errOdd := errors.New("odd")
	results, err := Race(n, func(i int) (int, error) {
		calls[i].Add(1)
		if i%2 == 1 {
			return 0, errOdd
		}
		return i, nil
	})
	for i := range n {
		if got := calls[i].Load(); got != 1 {
			t.Fatalf("call %d ran %d times", i, got)
		}
	}
	if len(results) != n/2 {
		t.Fatalf("%d results, want %d", len(results), n/2)
	}
	for _, r := range results {
		if r%2 != 0 {
			t.Fatalf("result %d is of a failed call", r)
		}
	}
	if !errors.Is(err, errOdd) {
		t.Fatalf("err = %v, want the failed calls' errors joined", err)
	}
}
