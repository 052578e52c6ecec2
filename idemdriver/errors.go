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

// ErrConflict is wrapped by Tx.Complete and Tx.Commit when the database
// aborted the transaction to resolve a conflict with a concurrent one:
// nothing of it committed, business writes and claim included. MySQL and
// MariaDB: error 1213 (a deadlock; on Galera also a write set that lost
// certification at COMMIT, or a transaction aborted by another node's
// commit). In the one-commit mode the core then reads the key again and
// answers from the record that won, if any (docs/contract.md "Modes").
var ErrConflict = errors.New("idemdriver: the database aborted the transaction in a conflict with a concurrent one; nothing of it committed")
