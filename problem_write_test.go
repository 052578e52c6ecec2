package idem_test

import (
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// TestProblemWriteForms: a problem without Extra is written as the map form
// writes it (members sorted), and one whose Extra cannot be encoded is
// still sent, without its extras, rather than as an empty body.
func TestProblemWriteForms(t *testing.T) {
	t.Parallel()
	pr := idem.ProblemFor(idem.ErrKeyReused, `a "quoted" <detail> & more`)
	rec := httptest.NewRecorder()
	pr.Write(rec)
	require.Equal(t, `{"detail":"a \"quoted\" <detail> & more","new_key_safe":true,"status":422,"title":"Idempotency-Key reused with a different request","type":"`+
		idem.ProblemTypeBase+`key-reused"}`+"\n", rec.Body.String())
	require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))

	withExtra := pr
	withExtra.Instance = "/v1/payments/1"
	withExtra.Extra = map[string]any{"original_status": 201, "new_key_safe": false} // idem's members win
	rec = httptest.NewRecorder()
	withExtra.Write(rec)
	require.Equal(t, `{"detail":"a \"quoted\" <detail> & more","instance":"/v1/payments/1","new_key_safe":true,"original_status":201,"status":422,`+
		`"title":"Idempotency-Key reused with a different request","type":"`+idem.ProblemTypeBase+`key-reused"}`+"\n", rec.Body.String())

	unencodable := pr
	unencodable.Extra = map[string]any{"callback": func() {}}
	rec = httptest.NewRecorder()
	unencodable.Write(rec)
	var got map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got), "body %q", rec.Body.String())
	require.Equal(t, idem.ProblemTypeBase+"key-reused", got["type"])
	require.Equal(t, 422, rec.Code)
}
