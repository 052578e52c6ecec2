package service

import "math/big"

// SumColumns sums the integer column exactly, in two 64-bit integer columns:
// the sums of each value's high and of its low 32 bits, which JoinSum puts
// back together. A plain SUM(column) overflows 64 bits past 2^63 (1024
// amounts of 2^53): SQLite fails ("integer overflow", and has no exact
// wider type), PostgreSQL's ::bigint fails, MySQL's CAST AS SIGNED clamps.
// The values must be non-negative and below 2^53; each sum then fits 64
// bits for up to 2^31 rows per group. cast wraps each SUM for the database
// (for example `CAST(... AS SIGNED)` on MySQL, `...::bigint` on PostgreSQL),
// so that it is read back as a 64-bit integer.
func SumColumns(column string, cast func(sum string) string) string {
	return cast(`SUM(`+column+` >> 32)`) + `, ` + cast(`SUM(`+column+` & 4294967295)`)
}

// JoinSum is high * 2^32 + low, exactly: the total of SumColumns's two sums.
// A *big.Int encodes as an exact JSON number (encoding/json).
func JoinSum(high, low int64) *big.Int {
	sum := new(big.Int).Lsh(big.NewInt(high), 32)
	return sum.Add(sum, big.NewInt(low))
}
