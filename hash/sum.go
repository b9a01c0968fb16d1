package hash

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// Sum is a SHA-256 digest produced by [Structure] or [Exact]. It is a
// comparable value type, usable as a map key. The zero Sum is never returned
// with a nil error.
type Sum [sha256.Size]byte

// String returns the digest as 64 lower-case hexadecimal digits.
func (s Sum) String() string {
	return hex.EncodeToString(s[:])
}

// IsZero reports whether s is the zero Sum (all bytes zero), which no
// successful hash returns; it is handy for "not computed yet".
func (s Sum) IsZero() bool {
	return s == Sum{}
}

// MarshalText implements [encoding.TextMarshaler]: the lower-case hex form,
// so a Sum is a JSON string and can key a JSON object.
func (s Sum) MarshalText() ([]byte, error) {
	out := make([]byte, hex.EncodedLen(len(s)))
	hex.Encode(out, s[:])
	return out, nil
}

// UnmarshalText implements [encoding.TextUnmarshaler]; it accepts what
// [ParseSum] accepts.
func (s *Sum) UnmarshalText(text []byte) error {
	if len(text) != hex.EncodedLen(len(s)) {
		return fmt.Errorf("%w: want %d hex digits, got %d bytes", ErrInvalidSum, hex.EncodedLen(len(s)), len(text))
	}
	var v Sum
	if _, err := hex.Decode(v[:], text); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidSum, err)
	}
	*s = v
	return nil
}

// ParseSum parses 64 hexadecimal digits (either case) as written by
// [Sum.String]. It returns an error wrapping [ErrInvalidSum] otherwise.
func ParseSum(s string) (Sum, error) {
	var v Sum
	err := v.UnmarshalText([]byte(s))
	return v, err
}
