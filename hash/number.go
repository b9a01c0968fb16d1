package hash

import (
	"math/big"
	"strconv"
	"strings"
)

// appendCanonicalNumber appends the canonical text of the JSON number s to
// dst. s must match the JSON number grammar (the decoder guarantees it).
//
// The canonical form is exact (no float64 rounding): leading and trailing
// zeros are removed from the significant digits and the decimal point and
// exponent are folded in, so 1, 1.0, 1e0 and 10e-1 all become "1". Negative
// zero becomes "0". A value that is an integer with at most 21 digits is
// written as plain digits ("100", "18446744073709551615"); any other value as
// d[.ddd]e<exp> ("5e-1", "1.5e30").
func appendCanonicalNumber(dst []byte, s string) []byte {
	neg := false
	if strings.HasPrefix(s, "-") {
		neg = true
		s = s[1:]
	}
	intPart := s
	frac := ""
	expText := ""
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		intPart, expText = s[:i], s[i+1:]
	}
	if i := strings.IndexByte(intPart, '.'); i >= 0 {
		intPart, frac = intPart[:i], intPart[i+1:]
	}
	// digits × 10^(exp - len(frac)) is the value; strip zeros. The digits
	// are split across intPart and frac; build them without allocating
	// unless both are non-empty.
	digits := intPart
	if frac != "" {
		digits = intPart + frac
	}
	digits = strings.TrimLeft(digits, "0")
	trimmed := strings.TrimRight(digits, "0")
	shift := int64(len(digits)-len(trimmed)) - int64(len(frac))
	digits = trimmed
	if digits == "" {
		return append(dst, '0')
	}
	if neg {
		dst = append(dst, '-')
	}
	n := int64(len(digits))

	exp, err := strconv.ParseInt(strings.TrimPrefix(expText, "+"), 10, 64)
	if expText == "" {
		exp, err = 0, nil
	}
	const safe = int64(1) << 60
	if err != nil || exp > safe || exp < -safe {
		// Astronomically large exponent: exact arithmetic with big.Int.
		// Such a value is never a short integer, so always use e-notation.
		e := new(big.Int)
		e.SetString(strings.TrimPrefix(expText, "+"), 10)
		e.Add(e, big.NewInt(shift+n-1))
		dst = appendMantissa(dst, digits)
		dst = append(dst, 'e')
		return e.Append(dst, 10)
	}
	e10 := exp + shift // value = digits × 10^e10
	if e10 >= 0 && e10+n <= 21 {
		dst = append(dst, digits...)
		for range e10 {
			dst = append(dst, '0')
		}
		return dst
	}
	dst = appendMantissa(dst, digits)
	dst = append(dst, 'e')
	return strconv.AppendInt(dst, e10+n-1, 10)
}

func appendMantissa(dst []byte, digits string) []byte {
	dst = append(dst, digits[0])
	if len(digits) > 1 {
		dst = append(dst, '.')
		dst = append(dst, digits[1:]...)
	}
	return dst
}
