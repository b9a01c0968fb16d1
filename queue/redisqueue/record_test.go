package redisqueue

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// encodeSet writes what json.Marshal writes, and decodeSet reads it back
// sorted, with or without the fast paths that skip encoding/json.
func TestSetEncoding(t *testing.T) {
	t.Parallel()
	for _, set := range [][]string{
		{"gpu"}, {"gpu", "xl"}, {""}, {"", "a"}, {"b", "a"},
		{"a/b"}, {"<x>"}, {"a&b"}, {`a"b`}, {`a\b`}, {`a","b`}, {"é"}, {"tab\t"}, {"\u2028"},
	} {
		want, err := json.Marshal(set)
		require.NoError(t, err)
		assert.Equal(t, string(want), encodeSet(set), "%q", set)
		got, err := decodeSet(encodeSet(set))
		require.NoError(t, err)
		assert.Equal(t, slices.Sorted(slices.Values(set)), got, "%q", set)
	}
	assert.Equal(t, "[]", encodeSet(nil))
}

// decodeSet reads what the scripts write (cjson escapes "/") and
// refuses what is not a JSON array of strings.
func TestDecodeSet(t *testing.T) {
	t.Parallel()
	for in, want := range map[string][]string{
		"": nil, "[]": nil, "{}": nil, `["gpu"]`: {"gpu"}, `["xl","gpu"]`: {"gpu", "xl"}, `["a\/b"]`: {"a/b"},
	} {
		got, err := decodeSet(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"{not json", `["a"]x"]`, `["a","b"`, `["a",1]`} {
		_, err := decodeSet(in)
		assert.Error(t, err, in)
	}
}

// FuzzSetEncoding: any set survives encodeSet and decodeSet, and is
// encoded as json.Marshal encodes it.
func FuzzSetEncoding(f *testing.F) {
	f.Add("gpu", "xl")
	f.Add(`a","b`, `\`)
	f.Add("<", "\x00")
	f.Fuzz(func(t *testing.T, a, b string) {
		set := []string{a, b}
		want, err := json.Marshal(set)
		require.NoError(t, err)
		require.Equal(t, string(want), encodeSet(set))
		got, err := decodeSet(encodeSet(set))
		require.NoError(t, err)
		var ref []string
		require.NoError(t, json.Unmarshal(want, &ref))
		require.Equal(t, slices.Sorted(slices.Values(ref)), got)
	})
}

// splitRecord reads back what a JSON encoder writes of a record: here
// encoding/json, which escapes more than cjson does (<, >, &, U+2028).
func TestSplitRecord(t *testing.T) {
	t.Parallel()
	vals := make([]any, nFields)
	for i := range vals {
		vals[i] = false
	}
	vals[fID], vals[fOv], vals[fRs], vals[fEm] = "id-1", "a\x00\x1f\"\\/<>&\u2028é", "", "line\nbreak\ttab"
	vals[fV] = 3 // a number: its text
	b, err := json.Marshal(vals)
	require.NoError(t, err)
	var r rawRecord
	require.NoError(t, splitRecord(string(b), &r))
	for i, v := range vals {
		switch v := v.(type) {
		case string:
			assert.True(t, r.has[i], recordFields[i])
			assert.Equal(t, v, r.v[i], recordFields[i])
		case int:
			assert.Equal(t, "3", r.v[i])
		default:
			assert.False(t, r.has[i], recordFields[i])
		}
	}
	// cjson writes a byte as \u00XX, and bytes that are not UTF-8 as they are.
	b = []byte(`["\u0000\u00ff` + "\xff\xfe" + `","x"` + strings.Repeat(",false", nFields-2) + `]`)
	r = rawRecord{}
	require.NoError(t, splitRecord(string(b), &r))
	assert.Equal(t, "\x00\xff\xff\xfe", r.v[fID])
	assert.Equal(t, "x", r.v[fSt])
	assert.False(t, r.has[fV])
}

func TestSplitRecordMalformed(t *testing.T) {
	t.Parallel()
	full := `["a"` + strings.Repeat(`,"b"`, nFields-1) + `]`
	var r rawRecord
	require.NoError(t, splitRecord(full, &r))
	for _, s := range []string{"", "[", "[]", full[:len(full)-1], full + " ", `["a"]`, full[:len(full)-1] + `,"c"]`,
		`["\q"` + strings.Repeat(",false", nFields-1) + `]`, `["\u12"` + strings.Repeat(",false", nFields-1) + `]`,
		`["a` + strings.Repeat(",false", nFields-1) + `]`, `[,` + strings.Repeat(",false", nFields-1) + `]`} {
		assert.Error(t, splitRecord(s, &r), "%q", s)
	}
}

// FuzzSplitRecord: a record of any valid strings survives encoding/json
// and splitRecord, and no input makes splitRecord panic.
func FuzzSplitRecord(f *testing.F) {
	f.Add("a", "\x00\"\\/", `["x"]`)
	f.Add("", "<>&\u2028", "é")
	f.Fuzz(func(t *testing.T, a, b, c string) {
		var r rawRecord
		_ = splitRecord(a+b+c, &r) // must not panic
		if !utf8.ValidString(a) || !utf8.ValidString(b) || !utf8.ValidString(c) {
			return // encoding/json would replace the bytes
		}
		vals := make([]any, nFields)
		for i := range vals {
			vals[i] = []any{a, b, c, false}[i%4]
		}
		enc, err := json.Marshal(vals)
		require.NoError(t, err)
		require.NoError(t, splitRecord(string(enc), &r))
		for i, v := range vals {
			if s, ok := v.(string); ok {
				require.True(t, r.has[i])
				require.Equal(t, s, r.v[i])
			} else {
				require.False(t, r.has[i])
			}
		}
	})
}
