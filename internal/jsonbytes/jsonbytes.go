// Package jsonbytes writes and reads JSON as bytes, without reflection,
// where comfypool's hot paths would otherwise run encoding/json: it
// appends values byte for byte as encoding/json writes them (strings,
// numbers, booleans, nil, lists and objects with their keys sorted; any
// other value goes through encoding/json, after the caller's Ext has had
// its turn), and cuts a JSON number off the front of a buffer. comfy
// writes its POST /prompt bodies with it and reads numbers in place; pool
// writes and reads a job's overrides.
package jsonbytes

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
)

// Ext appends v when v is of a type its caller writes itself (comfy's
// Link), reporting whether it did. AppendValue asks it before it falls
// back to encoding/json, for every value at any depth.
type Ext func(b []byte, v any) ([]byte, bool)

// AppendString appends s quoted as encoding/json quotes it: printable
// ASCII other than the characters it escapes ('"', '\\' and, as HTML
// does, '<', '>' and '&') as it is, anything else through encoding/json.
func AppendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			raw, _ := json.Marshal(s) // a string always encodes
			return append(b, raw...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// AppendStrings appends the list l as encoding/json encodes it.
func AppendStrings(b []byte, l []string) []byte {
	if l == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, s := range l {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendString(b, s)
	}
	return append(b, ']')
}

// AppendFloat appends f, finite, as encoding/json writes a float64: the
// shortest form that reads back as f, with an exponent (without a
// leading 0 in it) below 1e-6 and from 1e21.
func AppendFloat(b []byte, f float64) []byte {
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' { // e-09 -> e-9
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

// SortedKeys appends m's keys to keys, sorted (as encoding/json orders a
// map's members), and returns them: pass a stack array's slice to sort
// small maps without allocating.
func SortedKeys[V any](keys []string, m map[string]V) []string {
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// AppendObject appends m as encoding/json encodes it, its values with
// AppendValue.
func AppendObject(b []byte, m map[string]any, ext Ext) ([]byte, error) {
	if m == nil {
		return append(b, "null"...), nil
	}
	var keys [16]string
	b = append(b, '{')
	for i, k := range SortedKeys(keys[:0], m) {
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendString(b, k)
		b = append(b, ':')
		var err error
		if b, err = AppendValue(b, m[k], ext); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

// AppendValue appends v as encoding/json encodes it. ext, if not nil,
// writes the values of its caller's own types. It fails where
// encoding/json does (an infinite float, a func).
func AppendValue(b []byte, v any, ext Ext) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case string:
		return AppendString(b, v), nil
	case bool:
		return strconv.AppendBool(b, v), nil
	case int:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int64:
		return strconv.AppendInt(b, v, 10), nil
	case float64:
		if !math.IsInf(v, 0) && !math.IsNaN(v) { // else encoding/json's error
			return AppendFloat(b, v), nil
		}
	case json.Number:
		if num, rest, ok := CutNumber([]byte(v)); ok && len(rest) == 0 {
			return append(b, num...), nil
		}
	case []any:
		if v == nil {
			return append(b, "null"...), nil
		}
		b = append(b, '[')
		for i, x := range v {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = AppendValue(b, x, ext); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case map[string]any:
		return AppendObject(b, v, ext)
	case []string:
		return AppendStrings(b, v), nil
	default:
		if ext != nil {
			if out, ok := ext(b, v); ok {
				return out, nil
			}
		}
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, raw...), nil
}

// CutNumber reads a JSON number at the start of b (as JSON's grammar
// writes one: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?) and returns
// it and what follows. ok is false when b does not start with one.
func CutNumber(b []byte) (num, rest []byte, ok bool) {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = skipDigits(b, i)
	default:
		return nil, nil, false
	}
	if i < len(b) && b[i] == '.' {
		j := skipDigits(b, i+1)
		if j == i+1 {
			return nil, nil, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := skipDigits(b, i)
		if j == i {
			return nil, nil, false
		}
		i = j
	}
	return b[:i], b[i:], true
}

// skipDigits returns the index of the first byte of b at or after i that
// is not a decimal digit.
func skipDigits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// The readers below take JSON already validated (json.Valid), so that they
// need not check what they skip.

// SkipSpace drops the whitespace JSON allows before a token.
func SkipSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\n' || b[0] == '\r') {
		b = b[1:]
	}
	return b
}

// CutValidString cuts the string literal at the start of b, which is
// valid JSON: lit is the literal with its quotes, and plain reports that
// its text is lit[1:len(lit)-1] as it is (no escape and only ASCII: valid
// JSON holds no raw control character); otherwise the caller unquotes lit
// (json.Unmarshal).
func CutValidString(b []byte) (lit []byte, plain bool, rest []byte) {
	plain = true
	i := 1
	for ; b[i] != '"'; i++ {
		switch c := b[i]; {
		case c == '\\':
			plain = false
			i++ // the escaped character, maybe a quote
		case c >= 0x80:
			plain = false
		}
	}
	return b[:i+1], plain, b[i+1:]
}
