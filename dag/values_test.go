package dag

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
)

type valTestInt int16
type valTestString string
type valTestBool bool
type valTestFloat float32

func TestNormalizeValue(t *testing.T) {
	t.Parallel()
	ref := comfy.FileRef{Filename: "a.png", Subfolder: "sub", Type: "output"}
	remote := File{Name: "a.png", Backend: "gpu-0", Ref: ref}
	inMem := File{Name: "in.png", ContentType: "image/png", Data: []byte{1, 2, 3}}

	tests := []struct {
		name string
		v    any
		t    Type
		want any
	}{
		{"int", 7, TypeInt, int64(7)},
		{"int8", int8(-8), TypeInt, int64(-8)},
		{"named int", valTestInt(12), TypeInt, int64(12)},
		{"uint64 max int64", uint64(math.MaxInt64), TypeInt, int64(math.MaxInt64)},
		{"uintptr", uintptr(3), TypeInt, int64(3)},
		{"integral float", 3.0, TypeInt, int64(3)},
		{"negative zero to int", math.Copysign(0, -1), TypeInt, int64(0)},
		{"float32 integral", float32(1 << 20), TypeInt, int64(1 << 20)},
		{"json int", json.Number("-42"), TypeInt, int64(-42)},
		{"json big int", json.Number("9223372036854775807"), TypeInt, int64(math.MaxInt64)},
		{"json int zero fraction", json.Number("9223372036854775807.000"), TypeInt, int64(math.MaxInt64)},
		{"json exponent", json.Number("1e3"), TypeInt, int64(1000)},
		{"min int64 float", -9223372036854775808.0, TypeInt, int64(math.MinInt64)},

		{"float", 1.5, TypeFloat, 1.5},
		{"int to float", 2, TypeFloat, 2.0},
		{"uint to float", uint8(200), TypeFloat, 200.0},
		{"float32", float32(0.5), TypeFloat, 0.5},
		{"named float", valTestFloat(0.25), TypeFloat, 0.25},
		{"json float", json.Number("2.5e-3"), TypeFloat, 2.5e-3},
		{"json int to float", json.Number("4"), TypeFloat, 4.0},

		{"string", "héllo", TypeString, "héllo"},
		{"named string", valTestString("x"), TypeString, "x"},
		{"bool", true, TypeBool, true},
		{"named bool", valTestBool(false), TypeBool, false},

		{"file", inMem, TypeImage, inMem},
		{"file pointer", &remote, TypeImage, remote},
		{"file empty data", File{Name: "e", Data: []byte{}}, TypeImage, File{Name: "e", Data: []byte{}}},
		{"file map", map[string]any{"name": "in.png", "content_type": "image/png", "data": "AQID"}, TypeImage, inMem},
		{"file map bytes", map[string]any{"name": "in.png", "content_type": "image/png", "data": []byte{1, 2, 3}}, TypeImage, inMem},
		{"file map ref", map[string]any{"name": "a.png", "backend": "gpu-0", "ref": map[string]any{"filename": "a.png", "subfolder": "sub", "type": "output"}}, TypeImage, remote},
		{"file map FileRef", map[string]any{"name": "a.png", "backend": "gpu-0", "ref": ref}, TypeImage, remote},

		{"list of int", []int{1, 2}, ListOf(TypeInt), []any{int64(1), int64(2)}},
		{"array of float", [2]float32{1, 2}, ListOf(TypeFloat), []any{1.0, 2.0}},
		{"nil slice", []string(nil), ListOf(TypeString), []any{}},
		{"any slice", []any{json.Number("1"), 2}, ListOf(TypeInt), []any{int64(1), int64(2)}},
		{"list of images", []any{inMem, &remote}, ListOf(TypeImage), []any{inMem, remote}},
		{"list of lists", [][]int{{1}, {}}, ListOf(ListOf(TypeInt)), []any{[]any{int64(1)}, []any{}}},
		{"bytes as list of int", []byte{7}, ListOf(TypeInt), []any{int64(7)}},

		{"any nil", nil, TypeAny, nil},
		{"any int", 3, TypeAny, int64(3)},
		{"any uint", uint32(3), TypeAny, int64(3)},
		{"any float32", float32(0.5), TypeAny, 0.5},
		{"any json int", json.Number("12"), TypeAny, int64(12)},
		{"any json integral float", json.Number("12.0"), TypeAny, 12.0},
		{"any json huge", json.Number("99999999999999999999"), TypeAny, 1e20},
		{"any named string", valTestString("s"), TypeAny, "s"},
		{"any file pointer", &remote, TypeAny, remote},
		{"any nested", map[string]any{
			"a": []int{1},
			"b": map[string]float32{"x": 1},
			"c": []any{nil, true, json.Number("1.5"), map[string]any{}},
			"d": []File{inMem},
		}, TypeAny, map[string]any{
			"a": []any{int64(1)},
			"b": map[string]any{"x": 1.0},
			"c": []any{nil, true, 1.5, map[string]any{}},
			"d": []any{inMem},
		}},
		{"any nil map", map[string]int(nil), TypeAny, map[string]any{}},
		{"any named map", map[valTestString]int{"k": 1}, TypeAny, map[string]any{"k": int64(1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := normalizeValue(tt.v, tt.t)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			assertValRuntimeForm(t, got)
		})
	}
}

func TestNormalizeValueErrors(t *testing.T) {
	t.Parallel()
	type point struct{ X int }
	x := 1
	cyclic := []any{nil}
	cyclic[0] = cyclic
	tests := []struct {
		name string
		v    any
		t    Type
		msg  string // the error contains it
	}{
		{"string as int", "1", TypeInt, "expected int, got string"},
		{"nil as int", nil, TypeInt, "expected int, got nil"},
		{"fraction", 1.5, TypeInt, "not an integer"},
		{"json fraction", json.Number("1.5"), TypeInt, "not an integer"},
		{"uint64 overflow", uint64(math.MaxUint64), TypeInt, "overflows int64"},
		{"float overflow", 9223372036854775808.0, TypeInt, "overflows int64"},
		{"json overflow", json.Number("9223372036854775808"), TypeInt, "overflows int64"},
		{"nan as int", math.NaN(), TypeInt, "expected int"},
		{"bool as int", true, TypeInt, "expected int, got bool"},
		{"bad json number", json.Number("abc"), TypeInt, "not a number"},

		{"string as float", "1", TypeFloat, "expected float, got string"},
		{"nan", math.NaN(), TypeFloat, "not a finite number"},
		{"inf", math.Inf(-1), TypeFloat, "not a finite number"},
		{"json out of range", json.Number("1e400"), TypeFloat, "out of the float64 range"},

		{"int as string", 1, TypeString, "expected string, got int"},
		{"json number as string", json.Number("1"), TypeString, "expected string, got json.Number"},
		{"bytes as string", []byte("x"), TypeString, "expected string, got []uint8"},
		{"invalid utf8", "\xff", TypeString, "not valid UTF-8"},
		{"string as bool", "true", TypeBool, "expected bool, got string"},

		{"nil file pointer", (*File)(nil), TypeImage, "nil *File"},
		{"string as image", "a.png", TypeImage, "expected image, got string"},
		{"file without name", File{Data: []byte{1}}, TypeImage, "no name"},
		{"file without content", File{Name: "a"}, TypeImage, "neither data nor a backend"},
		{"file backend without ref", File{Name: "a", Backend: "b"}, TypeImage, "neither data nor a backend"},
		{"file map unknown key", map[string]any{"name": "a", "data": "", "size": 1}, TypeImage, `unknown field "size"`},
		{"file map bad base64", map[string]any{"name": "a", "data": "!!"}, TypeImage, "base64"},
		{"file map bad name", map[string]any{"name": 1}, TypeImage, `"name": expected string, got int`},
		{"file map bad ref", map[string]any{"name": "a", "backend": "b", "ref": "x"}, TypeImage, `"ref": expected object`},

		{"nil as list", nil, ListOf(TypeInt), "expected []int, got nil"},
		{"string as list", "abc", ListOf(TypeString), "expected []string, got string"},
		{"list element", []any{1, "2"}, ListOf(TypeInt), "at [1]: expected int, got string"},
		{"nested list element", [][]any{{1}, {2, 3.5}}, ListOf(ListOf(TypeInt)), "at [1][1]: expected int, got 3.5"},

		{"struct", point{1}, TypeAny, "dag.point is not a value"},
		{"pointer", &x, TypeAny, "*int is not a value"},
		{"bytes", []byte("x"), TypeAny, "[]byte is not a value"},
		{"raw json", json.RawMessage("1"), TypeAny, "json.RawMessage is not a value"},
		{"int keys", map[int]int{1: 1}, TypeAny, "map keys must be strings"},
		{"nested struct", map[string]any{"k": []any{point{}}}, TypeAny, `at ["k"][0]: dag.point is not a value`},
		{"any nan", []any{math.NaN()}, TypeAny, "at [0]: NaN is not a finite number"},
		{"any file", File{Name: "a"}, TypeAny, "neither data nor a backend"},
		{"any nil file", (*File)(nil), TypeAny, "nil *File"},
		{"cyclic", cyclic, TypeAny, "nested deeper than"},
		{"unknown type", 1, Type("complex"), `unknown type "complex"`},
		{"unknown element type", []int{}, Type("[][]complex"), `unknown type "[][]complex"`},
		{"empty type", 1, Type(""), `unknown type ""`},
		{"chan", make(chan int), TypeAny, "chan int is not a value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := normalizeValue(tt.v, tt.t)
			require.Error(t, err)
			assert.Nil(t, got)
			assert.Contains(t, err.Error(), tt.msg)
		})
	}
}

func TestNormalizeValueErrorIsShort(t *testing.T) {
	t.Parallel()
	big := make([]any, 100000)
	for i := range big {
		big[i] = int64(i)
	}
	big[99999] = "oops"
	_, err := normalizeValue(big, ListOf(TypeInt))
	require.Error(t, err)
	assert.Less(t, len(err.Error()), 200, err.Error())

	_, err = normalizeValue(map[string]any{strings.Repeat("k", 10000): struct{}{}}, TypeAny)
	require.Error(t, err)
	assert.Less(t, len(err.Error()), 200, err.Error())
}

func TestEncodeValuesFormat(t *testing.T) {
	t.Parallel()
	raw, err := encodeValues(map[string]any{
		"i":  int64(1) << 60,
		"f":  0.1,
		"nz": math.Copysign(0, -1),
		"s":  "<a&b>",
		"b":  true,
		"n":  nil,
		"l":  []any{int64(1), "x"},
		"m":  map[string]any{"k": 2.0},
		"fd": File{Name: "x.png", Data: []byte{}},
		"fr": File{Name: "y.png", Backend: "gpu", Ref: comfy.FileRef{Filename: "y.png", Type: "output"}},
	})
	require.NoError(t, err)
	assert.JSONEq(t, `{
		"b": true,
		"f": {"float": 0.1},
		"fd": {"file": {"name": "x.png", "data": ""}},
		"fr": {"file": {"name": "y.png", "backend": "gpu", "ref": {"filename": "y.png", "subfolder": "", "type": "output"}}},
		"i": {"int": 1152921504606846976},
		"l": [{"int": 1}, "x"],
		"m": {"map": {"k": {"float": 2}}},
		"n": null,
		"nz": {"float": -0},
		"s": "<a&b>"
	}`, string(raw))
	assert.Contains(t, string(raw), `"<a&b>"`, "no HTML escaping")
	assert.Contains(t, string(raw), `{"float":-0}`)

	// Deterministic: keys sorted.
	again, err := encodeValues(map[string]any{
		"i": int64(1) << 60, "f": 0.1, "nz": math.Copysign(0, -1), "s": "<a&b>", "b": true, "n": nil,
		"l": []any{int64(1), "x"}, "m": map[string]any{"k": 2.0},
		"fd": File{Name: "x.png", Data: []byte{}},
		"fr": File{Name: "y.png", Backend: "gpu", Ref: comfy.FileRef{Filename: "y.png", Type: "output"}},
	})
	require.NoError(t, err)
	assert.Equal(t, string(raw), string(again))
}

func TestEncodeValuesEmpty(t *testing.T) {
	t.Parallel()
	for _, m := range []map[string]any{nil, {}} {
		raw, err := encodeValues(m)
		require.NoError(t, err)
		assert.Nil(t, raw)
	}
	for _, s := range []string{"", " ", "null", " null\n", "{}"} {
		m, err := decodeValues(json.RawMessage(s))
		require.NoError(t, err, "%q", s)
		assert.Nil(t, m, "%q", s)
	}
}

func TestEncodeValuesErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		m    map[string]any
		msg  string
	}{
		{"nan", map[string]any{"x": math.NaN()}, `at ["x"]: NaN cannot be stored`},
		{"inf", map[string]any{"x": []any{math.Inf(1)}}, `at ["x"][0]: +Inf cannot be stored`},
		{"not runtime int", map[string]any{"x": 1}, "int is not a runtime value"},
		{"not runtime file pointer", map[string]any{"x": &File{Name: "a"}}, "*dag.File is not a runtime value"},
		{"invalid utf8", map[string]any{"x": "\xff"}, "not valid UTF-8"},
		{"invalid utf8 key", map[string]any{"\xff": "x"}, "not valid UTF-8"},
		{"nested", map[string]any{"x": map[string]any{"y": int32(1)}}, `at ["x"]["y"]: int32 is not a runtime value`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			raw, err := encodeValues(tt.m)
			require.Error(t, err)
			assert.Nil(t, raw)
			assert.Contains(t, err.Error(), tt.msg)
		})
	}
}

func TestDecodeValuesErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, msg string
	}{
		{`{`, "decode values"},
		{`[]`, "expected an object, got an array"},
		{`"x"`, "expected an object, got a string"},
		{`{"a":1}`, `at ["a"]: untagged number 1`},
		{`{"a":{}}`, "exactly one key, got 0"},
		{`{"a":{"int":1,"float":2}}`, "exactly one key, got 2"},
		{`{"a":{"int":1.5}}`, "not an int64"},
		{`{"a":{"int":9223372036854775808}}`, "not an int64"},
		{`{"a":{"int":"1"}}`, `"int": expected a number, got a string`},
		{`{"a":{"float":1e999}}`, "out of the float64 range"},
		{`{"a":{"float":null}}`, `"float": expected a number, got null`},
		{`{"a":{"map":[]}}`, `"map": expected an object, got an array`},
		{`{"a":{"map":{"b":{"x":1}}}}`, `at ["a"]["b"]: unknown tag "x"`},
		{`{"a":{"file":{}}}`, `"file": no name`},
		{`{"a":{"file":{"name":"x","data":"%%"}}}`, "base64"},
		{`{"a":{"file":{"name":"x","data":null}}}`, "expected base64 string"},
		{`{"a":{"file":{"name":"x","extra":1}}}`, `unknown field "extra"`},
		{`{"a":{"file":{"name":"x","ref":{"filename":1}}}}`, "expected string"},
		{`{"a":{"file":{"name":"x","ref":{"size":"1"}}}}`, `unknown field "size"`},
		{`{"a":{"file":[]}}`, `"file": expected an object`},
		{`{"a":[1]}`, `at ["a"][0]: untagged number`},
		{`{} {}`, "trailing data"},
		{`{}x`, "trailing data"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			m, err := decodeValues(json.RawMessage(tt.in))
			require.Error(t, err)
			assert.Nil(t, m)
			assert.Contains(t, err.Error(), tt.msg)
		})
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	t.Parallel()
	values := map[string]any{
		"max":       int64(math.MaxInt64),
		"min":       int64(math.MinInt64),
		"2^53+1":    int64(1<<53 + 1),
		"negzero":   math.Copysign(0, -1),
		"zero":      0.0,
		"tiny":      math.SmallestNonzeroFloat64,
		"maxfloat":  math.MaxFloat64,
		"third":     1.0 / 3,
		"integral":  3.0,
		"unicode":   "日本語 🎉 \u0000 \"quoted\" \\",
		"empty":     "",
		"list":      []any{},
		"map":       map[string]any{},
		"nil":       nil,
		"nilData":   File{Name: "r.png", Backend: "gpu-1", Ref: comfy.FileRef{Filename: "r.png", Subfolder: "a/b", Type: "temp"}},
		"emptyData": File{Name: "e.bin", Data: []byte{}},
		"data":      File{Name: "d.png", ContentType: "image/png", Data: []byte{0, 255, 10}},
		"both":      File{Name: "b.png", Data: []byte{1}, Backend: "x", Ref: comfy.FileRef{Filename: "b.png"}},
		"nested":    []any{[]any{[]any{map[string]any{"": []any{nil, false}}}}},
		"":          "empty key",
	}
	raw, err := encodeValues(values)
	require.NoError(t, err)
	got, err := decodeValues(raw)
	require.NoError(t, err)
	assertValIdentical(t, values, got)
	assert.True(t, math.Signbit(got["negzero"].(float64)), "-0 keeps its sign")
	assert.Nil(t, got["nilData"].(File).Data)
	assert.NotNil(t, got["emptyData"].(File).Data)
}

// TestValuesProperty: random runtime values survive encode/decode
// exactly, and re-encoding gives the same bytes.
func TestValuesProperty(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		m := make(map[string]any)
		for range r.IntN(5) + 1 {
			m[valRandString(r)] = valRandValue(r, 0)
		}
		raw, err := encodeValues(m)
		require.NoError(t, err, "case %d", i)
		got, err := decodeValues(raw)
		require.NoError(t, err, "case %d: %s", i, raw)
		if !valIdentical(m, got) {
			t.Fatalf("case %d: round trip changed the value\nwant %#v\ngot  %#v\nraw  %s", i, m, got, raw)
		}
		again, err := encodeValues(got)
		require.NoError(t, err)
		require.Equal(t, string(raw), string(again), "case %d", i)
	}
}

// TestNormalizeThenEncode: whatever normalizeValue accepts under TypeAny
// encodes, and decodes back valIdentical.
func TestNormalizeThenEncode(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 2000 {
		v := valRandGoValue(r, 0)
		n, err := normalizeValue(v, TypeAny)
		require.NoError(t, err, "case %d: %#v", i, v)
		assertValRuntimeForm(t, n)
		// Normalising a runtime value changes nothing.
		n2, err := normalizeValue(n, TypeAny)
		require.NoError(t, err)
		require.True(t, valIdentical(n, n2), "case %d: not idempotent", i)

		m := map[string]any{"v": n}
		raw, err := encodeValues(m)
		require.NoError(t, err, "case %d: %#v", i, n)
		got, err := decodeValues(raw)
		require.NoError(t, err)
		require.True(t, valIdentical(m, got), "case %d: %s", i, raw)
	}
}

func FuzzDecodeValues(f *testing.F) {
	seeds := []string{
		``, `null`, `{}`, `[]`, `1`, `"x"`, `{"a":null}`, `{"a":true}`, `{"a":"s"}`,
		`{"a":{"int":9223372036854775807}}`, `{"a":{"int":-9223372036854775808}}`,
		`{"a":{"float":-0}}`, `{"a":{"float":1e308}}`, `{"a":{"float":5e-324}}`,
		`{"a":[{"int":1},[],{"map":{}}]}`, `{"a":{"map":{"b":{"map":{"c":null}}}}}`,
		`{"a":{"file":{"name":"x","data":""}}}`, `{"a":{"file":{"name":"x","data":"AAEC","content_type":"image/png"}}}`,
		`{"a":{"file":{"name":"x","backend":"b","ref":{"filename":"f","subfolder":"s","type":"output"}}}}`,
		`{"a":{"file":{"name":"x","ref":{}}}}`, `{"a":{"int":1.0}}`, `{"a":{"float":"1"}}`,
		`{"a":1}`, `{"a":{"x":1}}`, `{"a":{"int":1,"map":{}}}`, `{"a":"\ud800"}`, "{\"\xff\":\"\xfe\"}",
		`{"a":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`, `{"a":{"file":{"name":"x","data":"A"}}}`,
		`{"a":{"int":1}} x`, `{"a":{"int":1}}{"b":null}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		m, err := decodeValues(in)
		if err != nil {
			if m != nil {
				t.Fatalf("error %v with a non-nil map", err)
			}
			return
		}
		assertValRuntimeForm(t, m)
		raw, err := encodeValues(m)
		if err != nil {
			t.Fatalf("decoded value does not encode: %v\ninput %q", err, in)
		}
		m2, err := decodeValues(raw)
		if err != nil {
			t.Fatalf("re-decode: %v\nencoded %s", err, raw)
		}
		if !valIdentical(m, m2) {
			t.Fatalf("not stable\nfirst  %#v\nsecond %#v", m, m2)
		}
		raw2, err := encodeValues(m2)
		if err != nil || string(raw) != string(raw2) {
			t.Fatalf("re-encode differs (%v):\n%s\n%s", err, raw, raw2)
		}
	})
}

// valIdentical is reflect.DeepEqual for runtime values, except that floats
// compare bit for bit (so -0 differs from 0) and nil and empty File data
// differ.
func valIdentical(a, b any) bool {
	switch x := a.(type) {
	case nil:
		return b == nil
	case float64:
		y, ok := b.(float64)
		return ok && math.Float64bits(x) == math.Float64bits(y)
	case int64, string, bool:
		return a == b
	case File:
		y, ok := b.(File)
		if !ok || (x.Data == nil) != (y.Data == nil) || string(x.Data) != string(y.Data) {
			return false
		}
		return x.Name == y.Name && x.ContentType == y.ContentType && x.Backend == y.Backend && x.Ref == y.Ref
	case []any:
		y, ok := b.([]any)
		if !ok || x == nil || y == nil || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !valIdentical(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || (x == nil) != (y == nil) || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !valIdentical(v, w) {
				return false
			}
		}
		return true
	}
	return false
}

func assertValIdentical(t *testing.T, want, got any) {
	t.Helper()
	if !valIdentical(want, got) {
		t.Fatalf("values differ\nwant %#v\ngot  %#v", want, got)
	}
}

// assertValRuntimeForm fails unless v is in runtime form.
func assertValRuntimeForm(t testing.TB, v any) {
	t.Helper()
	if err := valCheckRuntimeForm(v); err != nil {
		t.Fatalf("not in runtime form: %v", err)
	}
}

func valCheckRuntimeForm(v any) error {
	switch x := v.(type) {
	case nil, int64, string, bool, File:
		return nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Errorf("float %v", x)
		}
		return nil
	case []any:
		if x == nil {
			return fmt.Errorf("nil list")
		}
		for _, e := range x {
			if err := valCheckRuntimeForm(e); err != nil {
				return err
			}
		}
		return nil
	case map[string]any:
		for _, e := range x {
			if err := valCheckRuntimeForm(e); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("%T", v)
}

func valRandString(r *rand.Rand) string {
	alphabet := []string{"a", "B", "0", " ", "é", "日", "🎉", "\"", "\\", "<", "\n", "\u0000", "."}
	var b strings.Builder
	for range r.IntN(6) {
		b.WriteString(alphabet[r.IntN(len(alphabet))])
	}
	return b.String()
}

func valRandFloat(r *rand.Rand) float64 {
	switch r.IntN(6) {
	case 0:
		return math.Copysign(0, -1)
	case 1:
		return math.Float64frombits(r.Uint64()&^(0x7ff<<52) | uint64(r.IntN(0x7ff))<<52) // any finite
	case 2:
		return float64(r.Int64N(1 << 40))
	default:
		return r.NormFloat64() * math.Pow(10, float64(r.IntN(40)-20))
	}
}

// valRandValue returns a random value in runtime form.
func valRandValue(r *rand.Rand, depth int) any {
	n := 8
	if depth > 3 {
		n = 6
	}
	switch r.IntN(n) {
	case 0:
		return nil
	case 1:
		return r.IntN(2) == 0
	case 2:
		return valRandString(r)
	case 3:
		if r.IntN(2) == 0 {
			return int64(r.Uint64())
		}
		return r.Int64N(100) - 50
	case 4:
		return valRandFloat(r)
	case 5:
		f := File{Name: valRandString(r) + "x", ContentType: valRandString(r)}
		if r.IntN(2) == 0 {
			f.Data = make([]byte, r.IntN(5))
			for i := range f.Data {
				f.Data[i] = byte(r.Uint32())
			}
		} else {
			f.Backend = "b" + valRandString(r)
			f.Ref = comfy.FileRef{Filename: "f" + valRandString(r), Subfolder: valRandString(r), Type: valRandString(r)}
		}
		return f
	case 6:
		l := make([]any, r.IntN(4))
		for i := range l {
			l[i] = valRandValue(r, depth+1)
		}
		return l
	default:
		m := make(map[string]any)
		for range r.IntN(4) {
			m[valRandString(r)] = valRandValue(r, depth+1)
		}
		return m
	}
}

// valRandGoValue returns a random Go value that normalizeValue(…, TypeAny)
// accepts.
func valRandGoValue(r *rand.Rand, depth int) any {
	n := 16
	if depth > 3 {
		n = 12
	}
	switch r.IntN(n) {
	case 0:
		return int8(r.IntN(256) - 128)
	case 1:
		return uint16(r.Uint32())
	case 2:
		return valTestInt(r.IntN(1000))
	case 3:
		return float32(r.NormFloat64())
	case 4:
		return json.Number(fmt.Sprint(r.Int64()))
	case 5:
		return json.Number(fmt.Sprint(valRandFloat(r)))
	case 6:
		return valTestString(valRandString(r))
	case 7:
		return valTestBool(r.IntN(2) == 0)
	case 8:
		f := File{Name: "n", Data: []byte{byte(r.Uint32())}}
		if r.IntN(2) == 0 {
			return &f
		}
		return f
	case 9:
		return valRandValue(r, depth)
	case 10:
		return []int{r.IntN(10), r.IntN(10)}
	case 11:
		return map[valTestString]float64{"k": valRandFloat(r)}
	case 12:
		l := make([]any, r.IntN(4))
		for i := range l {
			l[i] = valRandGoValue(r, depth+1)
		}
		return l
	case 13:
		return [2]any{valRandGoValue(r, depth+1), nil}
	default:
		m := make(map[string]any)
		for range r.IntN(4) {
			m[valRandString(r)] = valRandGoValue(r, depth+1)
		}
		return m
	}
}

func TestValuesDepthLimit(t *testing.T) {
	t.Parallel()
	deep := func(n int) string {
		return `{"a":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}`
	}
	m, err := decodeValues(json.RawMessage(deep(valueMaxDepth - 1)))
	require.NoError(t, err)
	raw, err := encodeValues(m)
	require.NoError(t, err)
	m2, err := decodeValues(raw)
	require.NoError(t, err)
	assertValIdentical(t, m, m2)

	_, err = decodeValues(json.RawMessage(deep(valueMaxDepth + 5)))
	require.ErrorContains(t, err, "nested deeper than")
	deepMap := `{"a":` + strings.Repeat(`{"map":{"b":`, valueMaxDepth+5) + "null" + strings.Repeat("}}", valueMaxDepth+5) + "}"
	_, err = decodeValues(json.RawMessage(deepMap))
	require.ErrorContains(t, err, "nested deeper than")
}
