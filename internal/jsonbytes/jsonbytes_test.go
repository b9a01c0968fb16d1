package jsonbytes_test

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/internal/jsonbytes"
)

// point is a type of the caller's own, written by its Ext.
type point struct{ X, Y int }

func appendPoint(b []byte, v any) ([]byte, bool) {
	p, ok := v.(point)
	if !ok {
		return b, false
	}
	return append(b, []byte(`{"X":`+itoa(p.X)+`,"Y":`+itoa(p.Y)+`}`)...), true
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// AppendValue writes what encoding/json writes, for every kind of value a
// workflow holds and for the values it hands to encoding/json.
func TestAppendValueIsEncodingJSON(t *testing.T) {
	for _, v := range []any{
		nil, "", "plain", "quote \" back \\ slash", "<html> & co", "tab\tnew\nline", "ünïcode", "\u2028", "bad \xff utf-8", "\x7f",
		true, false, 0, -7, int64(math.MaxInt64), 1.5, 1e-7, 1e21, 123456789.0, math.Copysign(0, -1), 5e-324,
		json.Number("12345678901234567890"), json.Number("-0.5e+10"),
		[]any{}, []any(nil), []any{1, "a", nil, []any{true}},
		map[string]any{}, map[string]any(nil), map[string]any{"b": 1, "a": map[string]any{"z": "y", "<": []any{}}},
		[]string{"x", "y"}, []string(nil),
		uint8(7), float32(0.1), struct{ A int }{1}, map[string]int{"k": 1},
		point{1, 2}, []any{point{3, 4}}, map[string]any{"p": point{5, 6}},
	} {
		want, err := json.Marshal(v)
		require.NoError(t, err, "%#v", v)
		got, err := jsonbytes.AppendValue([]byte("prefix:"), v, appendPoint)
		require.NoError(t, err, "%#v", v)
		assert.Equal(t, "prefix:"+string(want), string(got), "%#v", v)
		got, err = jsonbytes.AppendValue(nil, v, nil) // without an Ext: encoding/json writes point
		require.NoError(t, err)
		assert.Equal(t, string(want), string(got), "%#v", v)
	}
}

// What encoding/json refuses, AppendValue refuses, and a number that is
// not one is not written as it is.
func TestAppendValueErrors(t *testing.T) {
	for _, v := range []any{math.Inf(1), math.NaN(), func() {}, json.Number("1."), json.Number("0x10"), []any{math.Inf(-1)}} {
		_, want := json.Marshal(v)
		_, err := jsonbytes.AppendValue(nil, v, nil)
		assert.Equal(t, want != nil, err != nil, "%#v: encoding/json %v, AppendValue %v", v, want, err)
	}
}

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "a", "\"", "<\u2028>", "\xff", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := jsonbytes.AppendString(nil, s); string(got) != string(want) {
			t.Fatalf("AppendString(%q) = %s, encoding/json %s", s, got, want)
		}
	})
}

// CutNumber takes the longest prefix of JSON's number grammar and nothing
// else: a number it cuts is valid JSON, and valid JSON that is a number
// is cut whole.
func FuzzCutNumber(f *testing.F) {
	for _, s := range []string{"0", "-1.5e+10,", "01", "1.", ".5", "-", "1e", "12]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		num, rest, ok := jsonbytes.CutNumber([]byte(s))
		var n json.Number
		whole := json.Unmarshal([]byte(s), &n) == nil && string(n) == s
		if whole && (!ok || len(rest) != 0) {
			t.Fatalf("CutNumber(%q) = %q, %q, %v; it is a whole number", s, num, rest, ok)
		}
		if ok && !json.Valid(num) {
			t.Fatalf("CutNumber(%q) cut %q, not JSON", s, num)
		}
		if ok && string(num)+string(rest) != s {
			t.Fatalf("CutNumber(%q) = %q + %q", s, num, rest)
		}
	})
}

// CutValidString cuts exactly the literal encoding/json wrote, whatever
// its text, and says plain only when the text is the literal's inside.
func FuzzCutValidString(f *testing.F) {
	for _, s := range []string{"", "a", `"`, `\`, "<&>", "\u2028", "é", "\x01"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		lit, _ := json.Marshal(s)
		got, plain, rest := jsonbytes.CutValidString(append(append([]byte(nil), lit...), `, "next"`...))
		if string(got) != string(lit) || string(rest) != `, "next"` {
			t.Fatalf("CutValidString(%s) = %s + %q", lit, got, rest)
		}
		if plain && string(got[1:len(got)-1]) != s {
			t.Fatalf("CutValidString(%s): plain, but %q is not %q", lit, got[1:len(got)-1], s)
		}
	})
}
