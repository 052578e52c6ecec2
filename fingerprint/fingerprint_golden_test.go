package fingerprint_test

import (
	"encoding/hex"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemgo/idem/fingerprint"
)

// TestFingerprintGolden pins Fingerprint's output: a fingerprint is stored
// with every record, so a release that changed it for any request would
// answer a retry across the upgrade with 422. Each digest was computed by
// the implementation before the single-pass canonicalizer, whose output
// must equal it.
func TestFingerprintGolden(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ method, target, contentType, body, want string }{
		{"POST", "/v1/payments", "application/json", `{"amount":1000,"currency":"JPY","customer":"cus_42","description":"Order #1001"}`, "c69b11d4647918f96d62ea01892f397d5aa39bb349a73280befd7c85ac06bd59"},
		{"POST", "/v1/payments", "application/json", ` { "description" : "Order #1001", "customer":"cus_42", "currency":"JPY","amount":1e3 } `, "c69b11d4647918f96d62ea01892f397d5aa39bb349a73280befd7c85ac06bd59"},
		{"POST", "/v1/payments?b=2&a=1", "application/json; charset=utf-8", `[1, 2.50, -0, 0.1, true, false, null, "x"]`, "bdcad79dcbc2f030ff29c5f591602f37c96ecaed8f50d13f143e9ae1a9a58f91"},
		{"POST", "/v1/payments", "application/json", `{"a":{"z":[{"y":1,"x":2}],"b":"\u00e9\n\t\"\\\/\u0001"},"\u20ac":1,"\ud83d\ude00":2,"\ufb33":3}`, "cd3dc04abe2fc8fa6b759e91eb2c55cf29bdf8e99495f014161ee331fd87af0f"},
		{"POST", "/v1/payments", "application/json", `{"amount":9007199254740993}`, "3b9143e5b4d49d9ef8407a834a054bc05c5d26e7fc49465ef0972ed2493ea4a5"},
		{"POST", "/v1/payments", "application/json", `{"amount":0.10000000000000000555}`, "0f2339444907c57ae1849bd2528079c1d0d1e2888f29669476fd3037049b339a"},
		{"POST", "/v1/payments", "application/json", `{"a":1,"a":2}`, "b7779d987e139e29d7d4ec001528cc00afd935477562051b499677c1f0178e07"},
		{"POST", "/v1/payments", "application/json", `{"a":"\ud800"}`, "dc1f910cec6b747e6832fdfec69a21febff903d32efcd9f6349f106de69dae86"},
		{"POST", "/v1/payments", "application/json", `{"a":1} {"b":2}`, "8f524ccd63c355ab025cedd95f221c77bbce776b79e7f75a9bc7700e5bba842e"},
		{"POST", "/v1/payments", "application/json", "{\"a\":\"\xff\"}", "6fe5fbd24d13e4181b2e992f1786ab8eab9aba6113c74171f73aa0e40e31debd"},
		{"POST", "/v1/payments", "application/json", ` 12 `, "e306889267c01ebaaa80a783e999de102ff086a0745aaf4c80d76298b45ee15b"},
		{"POST", "/v1/payments", "application/vnd.api+json", `{"b":1,"a":[]}`, "83437f7b116b9e4e4cfc3e2471c75ef6aa624fac239d0e719866d358d16c2e02"},
		{"POST", "/v1/payments", "text/plain", `{"b":1,"a":[]}`, "607469248f6394f6d9c2e4de85a6a5cb31411de7cf853747145ef756639fd2a7"},
		{"POST", "/v1/payments", "", ``, "92a375c66072d7a50fdcd6ab0d91cded79248a7fe730466ba77e346340d365f2"},
		{"PUT", "/v1/items/%2Fx?q=%zz", "Application/JSON", `{}`, "78a8dce10f3410c17c0a1c4e9a4308830b4982a8ae1df79a42df85d5003bb99c"},
		{"POST", "/v1/payments", "application/json", `{"description":"\ud83d\ude00","amount":1}`, "c4ecacd7eee20f576f9b7a28e8b953644128be3cdc01bdd846ca8421802fa321"},
		{"POST", "/v1/payments", "application/json", `{"\ud83d\ude00":1,"\uffff":2,"\ud800\u0041":3}`, "488071639182fae930578ef07c4ce8af2283e041d06c3307b518826e740d2a42"},
		{"POST", "/v1/payments", "application/json", "{\"b\":1,\"\xff\":2}", "929ee40920e366ae3af5db2529795e3f7e1d081617c4cebe666d4aec49616433"},
		{"POST", "/v1/payments", "application/json", `{"\ud800x":1}`, "68451093f5b58d41ae7cb7481660b3364d9f1eceabf31684b4f75547b26cec2f"},
		{"POST", "/v1/payments", "application/json", `00`, "42ec1d4826b9b4d22e2aea240b1997a8764c74dc211cd6bcebc980837f09683a"},
		{"POST", "/v1/payments", "application/json", `[1] x`, "107ed26cb177500744c12de29c78add6d28a7a8bdd5119d5fc2936dfa70bdf96"},
		{"POST", "/v1/payments", "application/json", `{"a":"\ud800\"x"}`, "64c066cc511a0f0173727d475e768e841a08e869f0fc9516cc18e4052f57bc4e"},
		{"POST", "/v1/payments", "application/json", `{"\ud800" `, "e00045c2abc58493a58804aff3346688810b822db6bfb933144e2a4eb9bd125c"},
		{"POST", "/v1/payments", "application/json", `{"a":1,"\udc00x"`, "57299e7a7294447c6b30063cb731bb68a0c7d1367fa76c033eb6943d3ed0d14d"},
		{"POST", "/v1/payments", "application/json", strings.Repeat("[", 70) + "1" + strings.Repeat("]", 70), "2029b5d60b16f0b6e42ee85be622ee343e83019436ddd6ad698d347eb007018d"},
		{"POST", "/v1/payments", "application/json", `[1.00000000000000000000000000000000000000000000000000000000000000000000001]`, "7596589d398e434d8c4777d78912f7b6505ffbe056a623c8c57ec66870d10048"},
		{"POST", "/v1/payments", "application/json", `{"b":[0.1000000000000000000000000000000000000000000],"a":-12.50e-3}`, "863d51b0be2b368319c4ef22f19c57a70c656afdb061811dce3a3631418bd4f3"},
	} {
		r := httptest.NewRequest(c.method, c.target, strings.NewReader(c.body))
		if c.contentType != "" {
			r.Header.Set("Content-Type", c.contentType)
		}
		got := hex.EncodeToString(fingerprint.Request(r, []byte(c.body)))
		if got != c.want {
			t.Errorf("Fingerprint(%s %s, %q, %q) = %s, want %s", c.method, c.target, c.contentType, c.body, got, c.want)
		}
	}
}
