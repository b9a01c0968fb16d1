package comfytest

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// refJSON is the encoding appendJSON replaces: encoding/json for every
// leaf, objects and arrays assembled around them.
func refJSON(t *testing.T, v any) []byte {
	t.Helper()
	var b bytes.Buffer
	switch x := v.(type) {
	case omap:
		b.WriteByte('{')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			k, err := marshalRaw(e.K)
			require.NoError(t, err)
			b.Write(k)
			b.WriteByte(':')
			b.Write(refJSON(t, e.V))
		}
		b.WriteByte('}')
	case []any:
		if x == nil {
			return []byte("null")
		}
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			b.Write(refJSON(t, e))
		}
		b.WriteByte(']')
	default:
		raw, err := marshalRaw(v)
		require.NoError(t, err)
		b.Write(raw)
	}
	return b.Bytes()
}

// TestAppendJSONMatchesEncodingJSON: the fake's direct encoder writes
// every value as encoding/json (without HTML escaping) does.
func TestAppendJSONMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	strs := []string{"", "plain", `quo"te`, `back\slash`, "new\nline", "tab\t", "\x00\x1f", "<html>&", "é ünïcode", "\u2028\u2029", "emoji 😀", "bad \xff utf8", "/slash"}
	var vals []any
	for _, s := range strs {
		vals = append(vals, s)
	}
	vals = append(vals, nil, true, false, 0, -7, 1<<40, 1.5, 1.0, 1e21, 1e-7, math.MaxInt64,
		pyFloat(1), pyFloat(0.25), pyFloat(1e16), json.Number("12.50"), []any(nil), []any{},
		map[string]any{"b": 1, "a": omap{{"z", 1}, {"y", []any{omap{}}}}},
		[]string{"x", "y"}, struct{ A int }{3})
	nested := omap{}
	for i, v := range vals {
		nested = append(nested, kv{strs[i%len(strs)], v})
	}
	vals = append(vals, nested, []any{nested, []any{nested}}, omap{{"data", omap{{"inner", nested}}}})
	for _, v := range vals {
		got, err := appendJSON(nil, v)
		require.NoError(t, err)
		assert.Equal(t, string(refJSON(t, v)), string(got), "%#v", v)
		assert.True(t, json.Valid(got), "%s", got)
	}
}
