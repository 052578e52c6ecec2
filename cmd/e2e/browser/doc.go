// Package browser shows idem behind CORS for pages that call an API from
// another origin, and tests it with a real browser: Chromium, driven over
// the DevTools protocol (chromedp), runs fetch() with an Idempotency-Key on
// a page served from localhost (docs/clients.md, "Browsers and CORS").
//
// It is a module of its own (go.work at the repository's root) so that the
// core module pulls neither rs/cors nor chromedp. The test needs the
// chromium binary (Debian's package chromium; CHROMIUM=PATH names another
// one): without it the test skips, or fails when CI is set.
package browser
