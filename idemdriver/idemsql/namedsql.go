package idemsql

// The statements below are shared by the drivers whose databases speak
// PostgreSQL's dialect of SQL: named parameters (@name) and INSERT ... ON
// CONFLICT ... DO UPDATE ... WHERE (idempgx, idemsqlite). A driver adds its
// own column list and clock expressions.

// ClaimUpsertSQL is the conflict clause of a claim's INSERT on a database
// with PostgreSQL's upsert, INSERT ... ON CONFLICT ... DO UPDATE ... WHERE
// (idempgx, idemsqlite): the claiming rows of Decide in SQL. stored names the
// stored record (the table's name, or its alias in the INSERT); the row the
// INSERT proposes is excluded, whose created_at is the claim's now and whose
// locked_until, created_at, updated_at and expires_at are the claim's.
// lockedUntil is the new lease's end, an SQL expression (excluded.locked_until,
// or a clock read when the write takes effect).
//
// The clause takes the record over when no live lease holds it (not
// PROCESSING with locked_until past now, nor PROCESSING with none: a
// damaged record, idemdriver.DecisionDamaged) and it is expired or the same
// request unfinished (ClaimContinuesSQL: Decision.Continues). A continued
// life keeps created_at and counts one more attempt; a new one starts at
// created_at now and attempts 1. Every claim writes the request's method,
// path, fingerprint and owner, PROCESSING, the next fencing token, the new
// lease and expires_at, and clears the stored response (seal_key, seal_tag and the kept request too). It ends with its
// WHERE; the caller adds RETURNING.
func ClaimUpsertSQL(stored, lockedUntil string) string {
	continues := ClaimContinuesSQL(stored)
	return `ON CONFLICT (scope, key) DO UPDATE SET
	method = excluded.method, path = excluded.path, fingerprint = excluded.fingerprint,
	state = 'PROCESSING', owner = excluded.owner,
	fencing_token = ` + stored + `.fencing_token + 1,
	locked_until = ` + lockedUntil + `,
	response_status = NULL, response_headers = NULL, response_body = NULL,
	response_body_stored = NULL, response_body_size = NULL, seal_key = '', seal_tag = NULL, request = NULL, completed_at = NULL,
	updated_at = excluded.updated_at,
	created_at = CASE WHEN ` + continues + ` THEN ` + stored + `.created_at ELSE excluded.created_at END,
	expires_at = excluded.expires_at,
	attempts = CASE WHEN ` + continues + ` THEN ` + stored + `.attempts + 1 ELSE 1 END
WHERE NOT (` + stored + `.state = 'PROCESSING' AND coalesce(` + stored + `.locked_until > excluded.created_at, true))
	AND (` + stored + `.expires_at <= excluded.created_at OR ` + continues + `)`
}

// ClaimContinuesSQL is the condition, in ClaimUpsertSQL, that the claim
// continues the stored record's life (Decision.Continues): stored is the
// same request as excluded (method, path and fingerprint), unfinished
// (FAILED, or PROCESSING, which under the clause's "no live lease" means
// past its lease).
func ClaimContinuesSQL(stored string) string {
	return `(` + stored + `.method = excluded.method AND ` + stored + `.path = excluded.path
	AND ` + stored + `.fingerprint = excluded.fingerprint AND ` + stored + `.state IN ('FAILED', 'PROCESSING'))`
}

// ListSQL is the read of one page of Lister.List: the records of idem_keys
// in primary-key order after (@after_scope, @after_key), at most @limit,
// filtered by @state, @scope and @key, each filter off when its parameter is
// the empty string. columns is the driver's select list of a record (with
// the request column, which Lister.List returns).
func ListSQL(columns string) string {
	return `SELECT ` + columns + ` FROM idem_keys
	WHERE (@state = '' OR state = @state) AND (@scope = '' OR scope = @scope) AND (@key = '' OR key = @key)
	AND (scope, key) > (@after_scope, @after_key)
	ORDER BY scope, key LIMIT @limit`
}
