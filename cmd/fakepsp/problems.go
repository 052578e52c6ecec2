package main

import "github.com/idemgo/idem/cmd/internal/service"

// ProblemTypeBase prefixes the type URI of fakepsp's own problems; idem's
// (missing-key, key-reused, request-in-flight, ...) keep idem's URIs.
const ProblemTypeBase = "https://github.com/idemgo/idem/blob/main/cmd/fakepsp/README.md#"

// svc writes fakepsp's answers and authenticates its requests, as
// paymentsd's ("Authorization: Bearer sk_test_<merchant>": paymentsd's
// provider client sends its merchant's key). Its problem kinds are
// service's.
var svc = &service.API{Name: "fakepsp", ProblemTypeBase: ProblemTypeBase}
