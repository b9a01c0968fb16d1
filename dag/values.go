package dag

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/comfypool/comfypool/comfy"
)

// Runtime values.
//
// A value flowing on a port is in runtime form: nil, int64, float64,
// string, bool, File, []any or map[string]any, nested. In runtime form
// floats are finite, strings and map keys are valid UTF-8, and lists and
// maps are never nil (an empty one is empty, not nil). normalizeValue
// turns what a user gives into that form; encodeValues and decodeValues
// store it. Every value normalizeValue returns encodes, and decodes back
// to a value reflect.DeepEqual to it (a -0 float keeps its sign, a File's
// nil Data stays nil and empty Data stays empty).
//
// Errors from these functions carry no "dag:" prefix: callers wrap them
// (fmt.Errorf("%w: input %q: %w", ErrMissingInput, name, err)).

// normalizeValue returns v in the runtime form of type t:
//
//   - TypeInt: any Go integer kind (named types too), json.Number, or a
//     float with an integral value; the result is int64, and a value out
//     of the int64 range is an error.
//   - TypeFloat: any integer or float kind, or json.Number; the result is
//     float64 (a large integer is rounded to the nearest float64). NaN and
//     ±Inf are errors.
//   - TypeString: a string kind (not json.Number, not []byte); valid UTF-8.
//   - TypeBool: a bool kind.
//   - TypeImage: a File, a non-nil *File, or a map[string]any with the
//     File's JSON fields (name, content_type, data as standard base64 or
//     []byte, backend, ref as {filename, subfolder, type} or a
//     comfy.FileRef; other keys are errors), which is what decoding a File
//     from JSON without a type gives. The File must have a Name and either
//     Data (non-nil, possibly empty) or a Backend and a Ref with a
//     Filename.
//   - a list type "[]T": any slice or array (not a string) whose elements
//     normalise to T; the result is []any, empty (not nil) for a nil slice.
//     nil itself is an error.
//   - TypeAny: v canonicalised recursively: nil stays nil; integer kinds →
//     int64 (a uint64 above MaxInt64 is an error); float kinds → float64;
//     json.Number → int64 when it is an integer literal that fits, else
//     float64; string and bool kinds; File or *File (checked as for
//     TypeImage) → File; slices and arrays → []any; maps with string keys
//     → map[string]any. Other kinds (structs, pointers, []byte, channels,
//     funcs…) are errors.
//
// Any other t is an error. Errors say where in v (a path such as
// [2]["key"]), what was expected and what type was given.
func normalizeValue(v any, t Type) (any, error) {
	if !valTypeKnown(t) {
		return nil, fmt.Errorf("unknown type %q", t)
	}
	out, err := valNormalizeAt(v, t, 0)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// valTypeKnown reports whether t is one of the value types or a list of
// one.
func valTypeKnown(t Type) bool {
	for {
		e, ok := t.Elem()
		if !ok {
			break
		}
		t = e
	}
	switch t {
	case TypeAny, TypeInt, TypeFloat, TypeString, TypeBool, TypeImage:
		return true
	}
	return false
}

// valueMaxDepth bounds the nesting of lists and maps, so that a cyclic or
// absurdly deep value is an error rather than a stack overflow.
const valueMaxDepth = 1000

// valPathError is an error at a position inside a value.
type valPathError struct {
	path []string // innermost last, e.g. `[2]`, `["k"]`
	err  error
}

func (e *valPathError) Error() string {
	var b strings.Builder
	b.WriteString("at ")
	for i := len(e.path) - 1; i >= 0; i-- {
		b.WriteString(e.path[i])
	}
	b.WriteString(": ")
	b.WriteString(e.err.Error())
	return b.String()
}

func (e *valPathError) Unwrap() error { return e.err }

// valAtPath adds one path element (outermost last) to err.
func valAtPath(err error, elem string) error {
	if pe, ok := err.(*valPathError); ok {
		pe.path = append(pe.path, elem)
		return pe
	}
	return &valPathError{path: []string{elem}, err: err}
}

func valIndexElem(i int) string  { return "[" + strconv.Itoa(i) + "]" }
func valKeyElem(k string) string { return "[" + strconv.Quote(valTrunc(k)) + "]" }
func valTrunc(s string) string {
	const limit = 64
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// valMismatch is the error for a value of the wrong type.
func valMismatch(want Type, v any) error {
	if v == nil {
		return fmt.Errorf("expected %s, got nil", want)
	}
	return fmt.Errorf("expected %s, got %T", want, v)
}

var valJSONNumberType = reflect.TypeFor[json.Number]()

func valNormalizeAt(v any, t Type, depth int) (any, error) {
	if depth > valueMaxDepth {
		return nil, fmt.Errorf("value nested deeper than %d levels", valueMaxDepth)
	}
	if elem, ok := t.Elem(); ok {
		return valNormalizeList(v, t, elem, depth)
	}
	switch t {
	case TypeAny:
		return valCanonical(v, depth)
	case TypeInt:
		return valInt(v)
	case TypeFloat:
		return valFloat(v)
	case TypeString:
		if v == nil {
			return nil, valMismatch(t, v)
		}
		rv := reflect.ValueOf(v)
		if rv.Kind() != reflect.String || rv.Type() == valJSONNumberType {
			return nil, valMismatch(t, v)
		}
		s := rv.String()
		if !utf8.ValidString(s) {
			return nil, errors.New("string is not valid UTF-8")
		}
		return s, nil
	case TypeBool:
		if v == nil {
			return nil, valMismatch(t, v)
		}
		rv := reflect.ValueOf(v)
		if rv.Kind() != reflect.Bool {
			return nil, valMismatch(t, v)
		}
		return rv.Bool(), nil
	case TypeImage:
		return valFile(v)
	}
	return nil, fmt.Errorf("unknown type %q", t)
}

func valNormalizeList(v any, t, elem Type, depth int) (any, error) {
	if v == nil {
		return nil, valMismatch(t, v)
	}
	rv := reflect.ValueOf(v)
	if k := rv.Kind(); k != reflect.Slice && k != reflect.Array {
		return nil, valMismatch(t, v)
	}
	out := make([]any, rv.Len())
	for i := range out {
		e, err := valNormalizeAt(rv.Index(i).Interface(), elem, depth+1)
		if err != nil {
			return nil, valAtPath(err, valIndexElem(i))
		}
		out[i] = e
	}
	return out, nil
}

// valCanonical is normalizeValue for TypeAny.
func valCanonical(v any, depth int) (any, error) {
	if depth > valueMaxDepth {
		return nil, fmt.Errorf("value nested deeper than %d levels", valueMaxDepth)
	}
	switch x := v.(type) {
	case nil:
		return nil, nil
	case json.Number:
		return valNumber(x)
	case File:
		return valCheckFile(x)
	case *File:
		if x == nil {
			return nil, errors.New("expected a File, got a nil *File")
		}
		return valCheckFile(*x)
	case []byte:
		return nil, errors.New("[]byte is not a value (use a File for binary data, or a string)")
	case json.RawMessage:
		return nil, errors.New("json.RawMessage is not a value (decode it first)")
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return valInt(v)
	case reflect.Float32, reflect.Float64:
		return valFloat(v)
	case reflect.String:
		s := rv.String()
		if !utf8.ValidString(s) {
			return nil, errors.New("string is not valid UTF-8")
		}
		return s, nil
	case reflect.Bool:
		return rv.Bool(), nil
	case reflect.Slice, reflect.Array:
		out := make([]any, rv.Len())
		for i := range out {
			e, err := valCanonical(rv.Index(i).Interface(), depth+1)
			if err != nil {
				return nil, valAtPath(err, valIndexElem(i))
			}
			out[i] = e
		}
		return out, nil
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			return nil, fmt.Errorf("map keys must be strings, got %T", v)
		}
		out := make(map[string]any, rv.Len())
		it := rv.MapRange()
		for it.Next() {
			k := it.Key().String()
			if !utf8.ValidString(k) {
				return nil, fmt.Errorf("map key %q is not valid UTF-8", valTrunc(k))
			}
			e, err := valCanonical(it.Value().Interface(), depth+1)
			if err != nil {
				return nil, valAtPath(err, valKeyElem(k))
			}
			out[k] = e
		}
		return out, nil
	}
	return nil, fmt.Errorf("%T is not a value (want a number, string, bool, File, list or map)", v)
}

// valNumber is a json.Number under TypeAny: int64 for an integer
// literal that fits, else float64.
func valNumber(n json.Number) (any, error) {
	if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
		return i, nil
	}
	f, err := valParseFloat(string(n))
	if err != nil {
		return nil, err
	}
	return f, nil
}

func valParseFloat(s string) (float64, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			return 0, fmt.Errorf("number %s is out of the float64 range", valTrunc(s))
		}
		return 0, fmt.Errorf("%q is not a number", valTrunc(s))
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%s is not a finite number", valTrunc(s))
	}
	return f, nil
}

// int64 range as float64: [-2^63, 2^63).
const (
	valMinInt64 = -9223372036854775808.0
	valMaxInt64 = 9223372036854775808.0
)

func valInt(v any) (int64, error) {
	if v == nil {
		return 0, valMismatch(TypeInt, v)
	}
	if n, ok := v.(json.Number); ok {
		s := string(n)
		if i, err := strconv.ParseInt(valTrimZeroFraction(s), 10, 64); err == nil {
			return i, nil
		}
		f, err := valParseFloat(s)
		if err != nil {
			return 0, err
		}
		return valFloatToInt(f, s)
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int(), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		u := rv.Uint()
		if u > math.MaxInt64 {
			return 0, fmt.Errorf("%d overflows int64", u)
		}
		return int64(u), nil
	case reflect.Float32, reflect.Float64:
		f := rv.Float()
		return valFloatToInt(f, strconv.FormatFloat(f, 'g', -1, 64))
	}
	return 0, valMismatch(TypeInt, v)
}

// valTrimZeroFraction turns "12.000" into "12" so that an integer written
// with a zero fraction is parsed exactly; other strings are returned as is.
func valTrimZeroFraction(s string) string {
	i := strings.IndexByte(s, '.')
	if i < 0 || strings.Trim(s[i+1:], "0") != "" {
		return s
	}
	return s[:i]
}

func valFloatToInt(f float64, text string) (int64, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("expected int, got %s", text)
	}
	if f != math.Trunc(f) {
		return 0, fmt.Errorf("expected int, got %s (not an integer)", valTrunc(text))
	}
	if f < valMinInt64 || f >= valMaxInt64 {
		return 0, fmt.Errorf("%s overflows int64", valTrunc(text))
	}
	return int64(f), nil
}

func valFloat(v any) (float64, error) {
	if v == nil {
		return 0, valMismatch(TypeFloat, v)
	}
	if n, ok := v.(json.Number); ok {
		return valParseFloat(string(n))
	}
	rv := reflect.ValueOf(v)
	var f float64
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		f = float64(rv.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		f = float64(rv.Uint())
	case reflect.Float32, reflect.Float64:
		f = rv.Float()
	default:
		return 0, valMismatch(TypeFloat, v)
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%v is not a finite number", f)
	}
	return f, nil
}

// valFile is normalizeValue for TypeImage.
func valFile(v any) (File, error) {
	switch x := v.(type) {
	case File:
		return valCheckFile(x)
	case *File:
		if x == nil {
			return File{}, errors.New("expected image, got a nil *File")
		}
		return valCheckFile(*x)
	case map[string]any:
		f, err := valFileFromMap(x)
		if err != nil {
			return File{}, err
		}
		return valCheckFile(f)
	}
	return File{}, valMismatch(TypeImage, v)
}

// valCheckFile returns f if it is a usable File: a Name and either Data or a
// Backend and a Ref with a Filename.
func valCheckFile(f File) (File, error) {
	if f.Name == "" {
		return File{}, errors.New("file has no name")
	}
	if f.Data == nil && (f.Backend == "" || f.Ref.Filename == "") {
		return File{}, fmt.Errorf("file %q has neither data nor a backend and ref", valTrunc(f.Name))
	}
	for _, s := range []string{f.Name, f.ContentType, f.Backend, f.Ref.Filename, f.Ref.Subfolder, f.Ref.Type} {
		if !utf8.ValidString(s) {
			return File{}, errors.New("file has a field that is not valid UTF-8")
		}
	}
	return f, nil
}

// valFileFromMap reads a File from its JSON fields (a decoded JSON object).
func valFileFromMap(m map[string]any) (File, error) {
	var f File
	str := func(key string, dst *string) error {
		v, ok := m[key]
		if !ok {
			return nil
		}
		s, ok := v.(string)
		if !ok {
			return fmt.Errorf("file field %q: expected string, got %T", key, v)
		}
		*dst = s
		return nil
	}
	for k := range m {
		switch k {
		case "name", "content_type", "data", "backend", "ref":
		default:
			return File{}, fmt.Errorf("file has an unknown field %q", valTrunc(k))
		}
	}
	if err := errors.Join(str("name", &f.Name), str("content_type", &f.ContentType), str("backend", &f.Backend)); err != nil {
		return File{}, err
	}
	if d, ok := m["data"]; ok {
		switch d := d.(type) {
		case []byte:
			f.Data = bytes.Clone(d)
			if f.Data == nil {
				f.Data = []byte{}
			}
		case string:
			b, err := base64.StdEncoding.DecodeString(d)
			if err != nil {
				return File{}, fmt.Errorf("file field \"data\": not standard base64: %w", err)
			}
			f.Data = b
		default:
			return File{}, fmt.Errorf("file field \"data\": expected base64 string, got %T", d)
		}
	}
	if r, ok := m["ref"]; ok {
		switch r := r.(type) {
		case comfy.FileRef:
			f.Ref = r
		case map[string]any:
			for k, v := range r {
				s, ok := v.(string)
				if !ok {
					return File{}, fmt.Errorf("file ref field %q: expected string, got %T", valTrunc(k), v)
				}
				switch k {
				case "filename":
					f.Ref.Filename = s
				case "subfolder":
					f.Ref.Subfolder = s
				case "type":
					f.Ref.Type = s
				default:
					return File{}, fmt.Errorf("file ref has an unknown field %q", valTrunc(k))
				}
			}
		default:
			return File{}, fmt.Errorf("file field \"ref\": expected object, got %T", r)
		}
	}
	return f, nil
}

// Stored form.
//
// encodeValues writes a map of runtime values as a JSON object whose
// values are tagged so that decoding restores exactly the same Go types:
//
//	nil            null
//	bool           true / false
//	string         "text"
//	[]any          [v, ...]                 (elements tagged the same way)
//	int64          {"int": 123}             (any int64, beyond 2^53 too)
//	float64        {"float": 1.5}           (shortest exact form; -0 stays -0)
//	map[string]any {"map": {"k": v, ...}}
//	File           {"file": {"name": ..., "content_type": ..., "data": base64,
//	                         "backend": ..., "ref": {...}}}
//
// A File's "data" is present exactly when Data is non-nil (empty data is
// ""), so nil and empty data stay distinct; content_type, backend and ref
// are left out when empty. A bare JSON number, an object with another
// shape, or anything else is a decoding error. NaN and ±Inf cannot be
// encoded; nor can strings or keys that are not valid UTF-8, nor types
// outside the runtime form (an int, say: normalise first). A nil or empty
// map is encoded as nil (JSON null), and null, empty input and {} decode
// to a nil map.

// encodeValues encodes m (values in runtime form) in the tagged form.
func encodeValues(m map[string]any) (json.RawMessage, error) {
	if len(m) == 0 {
		return nil, nil
	}
	var buf bytes.Buffer
	if err := valEncodeMap(&buf, m, 0); err != nil {
		return nil, err
	}
	return json.RawMessage(buf.Bytes()), nil
}

func valEncodeMap(buf *bytes.Buffer, m map[string]any, depth int) error {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	buf.WriteByte('{')
	for i, k := range keys {
		if !utf8.ValidString(k) {
			return fmt.Errorf("map key %q is not valid UTF-8", valTrunc(k))
		}
		if i > 0 {
			buf.WriteByte(',')
		}
		valWriteString(buf, k)
		buf.WriteByte(':')
		if err := valEncode(buf, m[k], depth+1); err != nil {
			return valAtPath(err, valKeyElem(k))
		}
	}
	buf.WriteByte('}')
	return nil
}

// valFileJSON is the stored form of a File; Data is a pointer so that nil
// and empty data stay distinct.
type valFileJSON struct {
	Name        string         `json:"name"`
	ContentType string         `json:"content_type,omitempty"`
	Data        *[]byte        `json:"data,omitempty"`
	Backend     string         `json:"backend,omitempty"`
	Ref         *comfy.FileRef `json:"ref,omitempty"`
}

func valEncode(buf *bytes.Buffer, v any, depth int) error {
	if depth > valueMaxDepth {
		return fmt.Errorf("value nested deeper than %d levels", valueMaxDepth)
	}
	switch x := v.(type) {
	case nil:
		buf.WriteString("null")
	case bool:
		buf.WriteString(strconv.FormatBool(x))
	case string:
		if !utf8.ValidString(x) {
			return errors.New("string is not valid UTF-8")
		}
		valWriteString(buf, x)
	case int64:
		buf.WriteString(`{"int":`)
		buf.WriteString(strconv.FormatInt(x, 10))
		buf.WriteByte('}')
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Errorf("%v cannot be stored (not a finite number)", x)
		}
		b, err := json.Marshal(x)
		if err != nil {
			return err
		}
		buf.WriteString(`{"float":`)
		buf.Write(b)
		buf.WriteByte('}')
	case []any:
		buf.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := valEncode(buf, e, depth+1); err != nil {
				return valAtPath(err, valIndexElem(i))
			}
		}
		buf.WriteByte(']')
	case map[string]any:
		buf.WriteString(`{"map":`)
		if err := valEncodeMap(buf, x, depth); err != nil {
			return err
		}
		buf.WriteByte('}')
	case File:
		for _, s := range []string{x.Name, x.ContentType, x.Backend, x.Ref.Filename, x.Ref.Subfolder, x.Ref.Type} {
			if !utf8.ValidString(s) {
				return errors.New("file has a field that is not valid UTF-8")
			}
		}
		fj := valFileJSON{Name: x.Name, ContentType: x.ContentType, Backend: x.Backend}
		if x.Data != nil {
			fj.Data = &x.Data
		}
		if x.Ref != (comfy.FileRef{}) {
			fj.Ref = &x.Ref
		}
		b, err := valMarshal(fj)
		if err != nil {
			return err
		}
		buf.WriteString(`{"file":`)
		buf.Write(b)
		buf.WriteByte('}')
	default:
		return fmt.Errorf("%T is not a runtime value (normalise it first)", v)
	}
	return nil
}

// valWriteString writes s (valid UTF-8) as a JSON string, without the
// HTML escaping of json.Marshal.
func valWriteString(buf *bytes.Buffer, s string) {
	b, _ := valMarshal(s) // a string always marshals
	buf.Write(b)
}

func valMarshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// decodeValues decodes the tagged form written by encodeValues. It never
// panics: malformed input is an error.
func decodeValues(raw json.RawMessage) (map[string]any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var top any
	if err := d.Decode(&top); err != nil {
		return nil, fmt.Errorf("decode values: %w", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("decode values: trailing data")
	}
	if top == nil {
		return nil, nil
	}
	obj, ok := top.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("decode values: expected an object, got %s", valJSONKind(top))
	}
	if len(obj) == 0 {
		return nil, nil
	}
	out, err := valDecodeMap(obj, 0)
	if err != nil {
		return nil, fmt.Errorf("decode values: %w", err)
	}
	return out, nil
}

func valDecodeMap(obj map[string]any, depth int) (map[string]any, error) {
	out := make(map[string]any, len(obj))
	for k, v := range obj {
		e, err := valDecode(v, depth+1)
		if err != nil {
			return nil, valAtPath(err, valKeyElem(k))
		}
		out[k] = e
	}
	return out, nil
}

// valDecode turns one tagged value (as decoded by encoding/json with
// UseNumber) into its runtime form.
func valDecode(v any, depth int) (any, error) {
	if depth > valueMaxDepth {
		return nil, fmt.Errorf("value nested deeper than %d levels", valueMaxDepth)
	}
	switch x := v.(type) {
	case nil, bool, string:
		return x, nil
	case json.Number:
		return nil, fmt.Errorf("untagged number %s", valTrunc(string(x)))
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			d, err := valDecode(e, depth+1)
			if err != nil {
				return nil, valAtPath(err, valIndexElem(i))
			}
			out[i] = d
		}
		return out, nil
	case map[string]any:
		if len(x) != 1 {
			return nil, fmt.Errorf("a tagged value has exactly one key, got %d", len(x))
		}
		var tag string
		var body any
		for tag, body = range x {
		}
		return valDecodeTagged(tag, body, depth)
	}
	return nil, fmt.Errorf("unexpected %s", valJSONKind(v))
}

func valDecodeTagged(tag string, body any, depth int) (any, error) {
	switch tag {
	case "int":
		n, ok := body.(json.Number)
		if !ok {
			return nil, fmt.Errorf(`"int": expected a number, got %s`, valJSONKind(body))
		}
		i, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil {
			return nil, fmt.Errorf(`"int": %s is not an int64`, valTrunc(string(n)))
		}
		return i, nil
	case "float":
		n, ok := body.(json.Number)
		if !ok {
			return nil, fmt.Errorf(`"float": expected a number, got %s`, valJSONKind(body))
		}
		return valParseFloat(string(n))
	case "map":
		m, ok := body.(map[string]any)
		if !ok {
			return nil, fmt.Errorf(`"map": expected an object, got %s`, valJSONKind(body))
		}
		return valDecodeMap(m, depth)
	case "file":
		m, ok := body.(map[string]any)
		if !ok {
			return nil, fmt.Errorf(`"file": expected an object, got %s`, valJSONKind(body))
		}
		if _, ok := m["name"]; !ok {
			return nil, errors.New(`"file": no name`)
		}
		f, err := valFileFromMap(m)
		if err != nil {
			return nil, fmt.Errorf(`"file": %w`, err)
		}
		return f, nil
	}
	return nil, fmt.Errorf("unknown tag %q", valTrunc(tag))
}

// valJSONKind names the JSON type of a value decoded with UseNumber.
func valJSONKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}
