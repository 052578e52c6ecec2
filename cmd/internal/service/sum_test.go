package service

import (
	"math"
	"math/big"
	"testing"
)

// JoinSum puts SumColumns's two sums back together exactly, past 2^63.
func TestJoinSum(t *testing.T) {
	const n = 1024
	amount := int64(1) << 53
	high, low := int64(0), int64(0)
	for range n {
		high += amount >> 32
		low += amount & math.MaxUint32
	}
	want := new(big.Int).Mul(big.NewInt(n), big.NewInt(amount))
	if got := JoinSum(high, low); got.Cmp(want) != 0 || got.String() != "9223372036854775808" {
		t.Fatalf("JoinSum = %s, want %s", got, want)
	}
	if got := JoinSum(0, 4294967295+7); got.Int64() != 4294967302 {
		t.Fatalf("JoinSum(0, 2^32+6) = %s", got)
	}
	if got := SumColumns("amount", func(s string) string { return "CAST(" + s + " AS SIGNED)" }); got !=
		"CAST(SUM(amount >> 32) AS SIGNED), CAST(SUM(amount & 4294967295) AS SIGNED)" {
		t.Fatalf("SumColumns = %q", got)
	}
}
