package replay

import (
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"strconv"
	"time"
)

// Exact durations of the schedule. A due time is a recorded offset divided by the speed; a rate cap's
// spacing is a second divided by the rate. Both are computed exactly, never in floating point: the
// speed (or rate) is taken as the decimal number it prints as (the one a user typed, 1e-6 is exactly
// one millionth), the quotient is rounded up to the nanosecond (a record is never due before its
// exact time), and a result beyond the largest time.Duration (about 292 years) is reported rather than
// wrapped around to a negative due time, which would send the record at once.

// maxSpan is the longest span of a schedule: the largest time.Duration.
const maxSpan = time.Duration(math.MaxInt64)

// ratio is the factor num/den (positive). ceilMul applies it to an integer exactly.
type ratio struct {
	num, den big.Int
	// n and d are num and den when both fit 64 bits: the common case, computed without big.Int.
	n, d  uint64
	small bool
}

// decimalRat is v (finite, positive) as the shortest decimal that reads back as v.
func decimalRat(v float64) *big.Rat {
	r, ok := new(big.Rat).SetString(strconv.FormatFloat(v, 'g', -1, 64))
	if !ok { // unreachable for a finite float
		r = new(big.Rat).SetFloat64(v)
	}
	return r
}

// perFactor returns the ratio unit/f: how many nanoseconds one unit of recorded time (or one event of a
// rate) lasts at factor f (a speed, or a rate in events per second when unit is a second).
func perFactor(unit time.Duration, f float64) *ratio {
	q := new(big.Rat).Quo(new(big.Rat).SetInt64(int64(unit)), decimalRat(f)) // in lowest terms
	r := &ratio{}
	r.num.Set(q.Num())
	r.den.Set(q.Denom())
	r.small = r.num.IsUint64() && r.den.IsUint64()
	if r.small {
		r.n, r.d = r.num.Uint64(), r.den.Uint64()
	}
	return r
}

// ceilMul returns ⌈x·num/den⌉ and true, or false when it exceeds maxSpan.
func (r *ratio) ceilMul(x uint64) (time.Duration, bool) {
	if r.small {
		hi, lo := bits.Mul64(x, r.n)
		if hi >= r.d { // the quotient needs more than 64 bits
			return 0, false
		}
		q, rem := bits.Div64(hi, lo, r.d)
		if q > uint64(maxSpan) || rem != 0 && q == uint64(maxSpan) {
			return 0, false
		}
		if rem != 0 {
			q++
		}
		return time.Duration(q), true
	}
	var p, q, m big.Int
	p.Mul(p.SetUint64(x), &r.num)
	q.QuoRem(&p, &r.den, &m)
	if m.Sign() != 0 {
		q.Add(&q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return 0, false
	}
	return time.Duration(q.Int64()), true
}

// addSpan returns a+b (both >= 0) and true, or false when it exceeds maxSpan.
func addSpan(a, b time.Duration) (time.Duration, bool) {
	if b > maxSpan-a {
		return 0, false
	}
	return a + b, true
}

// offsetMs is observed-start in milliseconds, exact for any two int64 with observed >= start.
func offsetMs(observed, start int64) uint64 { return uint64(observed) - uint64(start) }

// addMs returns a+b and true, or false when the sum is beyond the int64 range (a window's bounds on
// the observed clock; saturated: beyond the range is beyond every record).
func addMs(a, b int64) (int64, bool) {
	s := a + b
	if b > 0 && s < a || b < 0 && s > a {
		if b > 0 {
			return math.MaxInt64, false
		}
		return math.MinInt64, false
	}
	return s, true
}

// years describes a nanosecond count as a human span, for the errors of schedules that do not fit.
func years(ns float64) string {
	return fmt.Sprintf("%.3g years", ns/(365.25*24*float64(time.Hour)))
}

// fmtMsExact formats a millisecond count as seconds with three decimals, exactly.
func fmtMsExact(ms uint64) string {
	return strconv.FormatUint(ms/1000, 10) + "." + fmt.Sprintf("%03d", ms%1000) + "s"
}
