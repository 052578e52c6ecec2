package protocol

import (
	"testing"
	"time"

	"github.com/idemgo/idem/idemdriver"
)

// The replay cache keeps only SUCCEEDED records with their response, and
// none whose expires_at has passed on this process's clock: a retry after
// the key expired must reach the store and run as a new request.
func TestReplayCacheKeepsOnlyLiveSucceededRecords(t *testing.T) {
	t.Parallel()
	rc := newReplayCache(1<<20, time.Hour)
	live := idemdriver.Record{State: idemdriver.StateSucceeded, Response: &idemdriver.Response{Status: 201, BodyStored: true},
		ExpiresAt: time.Now().Add(time.Hour), Method: "POST", Path: "/pay", Fingerprint: []byte{1}}
	for name, rec := range map[string]idemdriver.Record{
		"expired":    func() idemdriver.Record { r := live; r.ExpiresAt = time.Now().Add(-time.Second); return r }(),
		"failed":     func() idemdriver.Record { r := live; r.State = idemdriver.StateFailed; return r }(),
		"processing": func() idemdriver.Record { r := live; r.State, r.Response = idemdriver.StateProcessing, nil; return r }(),
	} {
		rc.put("s", name, rec, true)
		if _, _, ok := rc.get("s", name); ok {
			t.Errorf("%s: cached", name)
		}
	}
	rc.put("s", "live", live, true)
	got, opened, ok := rc.get("s", "live")
	if !ok || !opened || got.State != idemdriver.StateSucceeded || got.Response.Status != live.Response.Status || got.Key != "live" || got.Scope != "s" {
		t.Fatalf("live record: %+v %v", got, ok)
	}
	rc.put("s", "raw", live, false)
	if _, opened, ok := rc.get("s", "raw"); !ok || opened {
		t.Fatal("a record cached as the store returned it is not opened")
	}
	if _, _, ok := rc.get("other", "live"); ok {
		t.Fatal("a record is cached for its scope only")
	}
}
