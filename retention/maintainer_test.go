package retention_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/dbtest"
	"github.com/idemgo/idem/retention"
)

// bareStore is a driver without the optional maintenance interfaces.
type bareStore struct{ idemdriver.Driver }

func TestNewMaintainerRefusesWhatItCannotDo(t *testing.T) {
	_, err := retention.NewMaintainer(bareStore{}, retention.Config{})
	require.ErrorIs(t, err, retention.ErrUnsupported)

	store := dbtest.SQLite(t)
	_, err = retention.NewMaintainer(store, retention.Config{Interval: -time.Second, Batch: -1})
	require.ErrorContains(t, err, "Interval")
	require.ErrorContains(t, err, "Batch")

	cfg := retention.Config{}.WithDefaults()
	require.Equal(t, retention.DefaultInterval, cfg.Interval)
	require.Equal(t, retention.DefaultBatch, cfg.Batch)
	require.Equal(t, 3*time.Minute, cfg.LockTTL)
	require.NotEmpty(t, cfg.Holder)
}

func TestMaintainerStartStop(t *testing.T) {
	store := dbtest.SQLite(t)
	m, err := retention.NewMaintainer(store, retention.Config{Interval: time.Millisecond})
	require.NoError(t, err)
	m.Stop() // before Start: a no-op
	require.NoError(t, m.Start(context.Background()))
	require.Error(t, m.Start(context.Background()), "already started")
	require.Eventually(t, func() bool { return m.Stats().LeaderCycles >= 3 }, 10*time.Second, time.Millisecond)
	require.True(t, m.Stats().Leader)
	m.Stop()
	m.Stop()
	st := m.Stats()
	require.False(t, st.Leader, "Stop releases the lock")
	require.Zero(t, st.Errors)
	// The lock is free again: another maintainer leads at once.
	other, err := retention.NewMaintainer(store, retention.Config{Interval: time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, other.Start(context.Background()))
	defer other.Stop()
	require.Eventually(t, func() bool { return other.Stats().Leader }, 10*time.Second, time.Millisecond)
}

func TestConfigRetentionBoundByStore(t *testing.T) {
	_, err := idem.NewMiddleware(limited{}, idem.Options{Engine: idem.EngineOptions{Retention: 48 * time.Hour}, Scope: idem.SingleTenant})
	require.ErrorContains(t, err, "exceeds the store's MaxRetention 24h0m0s")
	_, err = idem.NewMiddleware(limited{}, idem.Options{Engine: idem.EngineOptions{Retention: 24 * time.Hour}, Scope: idem.SingleTenant})
	require.NoError(t, err)
}

type limited struct{ idemdriver.Driver }

func (limited) MaxRetention() time.Duration { return 24 * time.Hour }
