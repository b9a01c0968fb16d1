package redisqueue

import (
	"encoding/json"
	"slices"
	"testing"

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
