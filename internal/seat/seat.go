// Package seat holds one process's seat among many: a lease row taken and
// renewed through idemdriver.MaintenanceLocker (the database's clock, a
// fencing token), for the retention maintainer and the completer, each
// under its own lease name.
package seat

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/idemdriver"
)

// Holder names this process in a seat's lease, by default:
// "hostname:pid".
func Holder() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

// Seat is one role's lease, held by at most one process at a time. Its
// methods but Held are not safe for concurrent use: one loop owns it.
type Seat struct {
	locker    idemdriver.MaintenanceLocker
	params    idemdriver.LockParams
	role      string // in the log lines: "maintainer", "completer"
	logger    *slog.Logger
	lock      idemdriver.MaintenanceLock
	refreshed time.Time
	held      atomic.Bool
}

// New returns the seat of role, taken with params (its Name, Holder, TTL).
func New(locker idemdriver.MaintenanceLocker, params idemdriver.LockParams, role string, logger *slog.Logger) *Seat {
	return &Seat{locker: locker, params: params, role: role, logger: logger}
}

// Take takes the lease, or confirms (and renews) it; false, nil when
// another process holds it. A renewal that fails gives the seat up and
// returns its error.
func (s *Seat) Take(ctx context.Context) (bool, error) {
	if s.lock != nil {
		if err := s.lock.Refresh(ctx); err != nil {
			s.Leave("lease lost: " + err.Error())
			return false, err
		}
		s.refreshed = time.Now()
		return true, nil
	}
	l, err := s.locker.TryLockMaintenance(ctx, s.params)
	if errors.Is(err, idemdriver.ErrLockHeld) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	s.lock, s.refreshed = l, time.Now()
	s.held.Store(true)
	s.logger.Info("idem: "+s.role+": this process is now the "+s.role, "holder", s.params.Holder)
	return true, nil
}

// Leave gives the lease up, if held (why goes to the log).
func (s *Seat) Leave(why string) {
	if s.lock == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.lock.Release(ctx); err != nil {
		s.logger.Warn("idem: "+s.role+": releasing its lease", "err", err)
	}
	s.lock = nil
	s.held.Store(false)
	s.logger.Info("idem: "+s.role+": no longer the "+s.role, "holder", s.params.Holder, "reason", why)
}

// Lock is the held lease, nil when not held.
func (s *Seat) Lock() idemdriver.MaintenanceLock { return s.lock }

// Refreshed is when the lease was last taken or confirmed.
func (s *Seat) Refreshed() time.Time { return s.refreshed }

// Held reports whether this process holds the seat; safe for concurrent
// use.
func (s *Seat) Held() bool { return s.held.Load() }
