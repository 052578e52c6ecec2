package idemdriver

import "errors"

// ErrTxDone is wrapped by Tx.Complete when the handler committed or rolled
// back the claim's transaction itself: the completion could not ride in it.
var ErrTxDone = errors.New("idem: the claim's transaction was already committed or rolled back by the handler")

// ErrTxAborted is wrapped by Tx.Complete when the claim's transaction had
// aborted before the completion (PostgreSQL: a statement of the handler
// failed, SQLSTATE 25P02 "current transaction is aborted"): nothing more can
// be written in it and its business writes are gone. The core then rolls it
// back and records the handler's answer on its own; a 2xx answer is a
// handler bug, recorded FAILED (CONTRACT section 6).
var ErrTxAborted = errors.New("idem: the claim's transaction had aborted before its completion")
