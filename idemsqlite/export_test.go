package idemsqlite

// AbandonedSQL is the completer's read, for its query plan.
var AbandonedSQL = abandonedSQL
