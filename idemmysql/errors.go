package idemmysql

import (
	"errors"

	"github.com/go-sql-driver/mysql"
)

// kind is what a MySQL error means to the claim protocol.
type kind int

const (
	// kindOther: the store could not answer; the error is returned (503).
	kindOther kind = iota
	// kindDuplicate: 1062 ER_DUP_ENTRY. A concurrent claim inserted the key
	// first; read again and answer from its row.
	kindDuplicate
	// kindDeadlock: 1213 ER_LOCK_DEADLOCK. InnoDB rolled this statement's
	// transaction back to break a cycle; run the round again. On Galera
	// also a COMMIT whose write set lost certification to a conflicting
	// transaction committed first on another node, and any statement of a
	// transaction that such a commit aborted (a brute-force abort): the
	// whole transaction is rolled back there too (aborted).
	kindDeadlock
	// kindLockWait: 1205 ER_LOCK_WAIT_TIMEOUT. Another transaction held the
	// row longer than innodb_lock_wait_timeout; read again and answer from
	// the row (see Claim).
	kindLockWait
	// kindChanged: 1020 ER_CHECKREAD, "Record has changed since last read"
	// (MariaDB 11.6+ with innodb_snapshot_isolation). Run the round again.
	kindChanged
	// kindUnknownVariable: 1193 ER_UNKNOWN_SYSTEM_VARIABLE. Open's session
	// settings name a variable this server does not have.
	kindUnknownVariable
	// kindRaced is not an error: a compare-and-set UPDATE matched no row
	// because a concurrent write changed it first. Counted with the others.
	kindRaced
	numKinds
)

func (k kind) String() string {
	return [...]string{"other", "duplicate", "deadlock", "lock-wait", "changed", "unknown-variable", "raced"}[k]
}

// classify is the one place that maps MySQL error numbers to what the claim
// protocol does with them. Errors that are not MySQL server errors
// (connection refused, context cancelled, ...) are kindOther.
func classify(err error) kind {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return kindOther
	}
	switch me.Number {
	case 1062:
		return kindDuplicate
	case 1213:
		return kindDeadlock
	case 1205:
		return kindLockWait
	case 1020:
		return kindChanged
	case 1193:
		return kindUnknownVariable
	}
	return kindOther
}

// aborted reports an error by which the server rolled the whole
// transaction back in a conflict with another (1213): in a business
// transaction, nothing of it committed (idemdriver.ErrConflict).
func aborted(err error) bool { return classify(err) == kindDeadlock }

// schemaTooOld reports an error by which a statement named a table or a
// column the schema does not have (1146 ER_NO_SUCH_TABLE, 1054
// ER_BAD_FIELD_ERROR): the migrations that add it are not applied. The
// statement wrote nothing.
func schemaTooOld(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1146 || me.Number == 1054)
}

// checkViolated reports an error by which a write failed a CHECK constraint
// (MariaDB's 4025 ER_CONSTRAINT_FAILED, MySQL's 3819
// ER_CHECK_CONSTRAINT_VIOLATED). The statement wrote nothing.
func checkViolated(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 4025 || me.Number == 3819)
}
