package comfytest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/comfypool/comfypool/internal/jsonbytes"
)

// omap is a JSON object that keeps its key order, as Python dicts do.
type omap []kv

type kv struct {
	K string
	V any
}

func (m omap) get(k string) (any, bool) {
	for _, e := range m {
		if e.K == k {
			return e.V, true
		}
	}
	return nil, false
}

func (m *omap) set(k string, v any) {
	for i, e := range *m {
		if e.K == k {
			(*m)[i].V = v
			return
		}
	}
	*m = append(*m, kv{k, v})
}

func (m omap) del(k string) omap {
	out := m[:0:0]
	for _, e := range m {
		if e.K != k {
			out = append(out, e)
		}
	}
	return out
}

func (m omap) keys() []string {
	ks := make([]string, len(m))
	for i, e := range m {
		ks[i] = e.K
	}
	return ks
}

// MarshalJSON writes the object with its keys in insertion order.
func (m omap) MarshalJSON() ([]byte, error) {
	return appendJSON(nil, m)
}

// appendJSON appends v encoded as marshalRaw encodes it. The values the
// fake builds its messages from (omap, []any, strings, json.Number,
// pyFloat, bool, nil) are written directly, in one buffer: through
// encoding/json, each nested omap took an encoder and a buffer of its
// own, and its output was validated again at every level above it, which
// was most of the fake's work per prompt. Other values go through
// marshalRaw.
func appendJSON(b []byte, v any) ([]byte, error) {
	switch t := v.(type) {
	case omap:
		b = append(b, '{')
		for i, e := range t {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, e.K)
			b = append(b, ':')
			var err error
			if b, err = appendJSON(b, e.V); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	case []any:
		if t == nil {
			return append(b, "null"...), nil
		}
		b = append(b, '[')
		for i, e := range t {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendJSON(b, e); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case string:
		return appendJSONString(b, t), nil
	case nil:
		return append(b, "null"...), nil
	case bool:
		return strconv.AppendBool(b, t), nil
	case int:
		return strconv.AppendInt(b, int64(t), 10), nil
	case pyFloat:
		return append(b, pyFloatString(float64(t))...), nil
	case rawJSON:
		return append(b, t...), nil
	}
	raw, err := marshalRaw(v)
	if err != nil {
		return nil, err
	}
	return append(b, raw...), nil
}

// rawJSON is a value already encoded by appendPy (Python's form),
// written as it is.
type rawJSON []byte

// appendJSONString appends s quoted as marshalRaw quotes it (no HTML
// escaping): plain printable ASCII as it is, anything else through
// encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			raw, _ := marshalRaw(s) // a string always encodes
			return append(b, raw...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// pyFloat is a float64 that marshals like Python's json (1.0, not 1).
type pyFloat float64

// MarshalJSON formats the float the way Python's repr does for common values.
func (f pyFloat) MarshalJSON() ([]byte, error) {
	return []byte(pyFloatString(float64(f))), nil
}

func pyFloatString(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	if f == math.Trunc(f) && math.Abs(f) < 1e16 {
		return strconv.FormatFloat(f, 'f', 1, 64)
	}
	s := strconv.FormatFloat(f, 'g', -1, 64)
	return s
}

func marshalRaw(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

// pyJSON encodes v the way Python's json.dumps does by default: ", " and
// ": " separators and non-ASCII characters escaped as \uXXXX. What it
// returns is v's own; the hot paths (frames, answers) use appendPyValue
// with a buffer from getBuf instead.
func pyJSON(v any) []byte {
	// The scratch stays on the stack unless v's JSON outgrows it.
	return bytes.Clone(appendPyValue(make([]byte, 0, 4096), v))
}

// appendPyValue appends v as pyJSON encodes it: when v does not encode (a
// UI value of the user's, say; the values this package builds always do),
// an object naming the error instead.
func appendPyValue(b []byte, v any) []byte {
	out, err := appendPy(b, v)
	if err != nil {
		return appendEncodeError(b, err)
	}
	return out
}

// appendEncodeError appends what pyJSON gives for a value that does not
// encode.
func appendEncodeError(b []byte, err error) []byte {
	raw, _ := json.Marshal(map[string]string{"comfytest_encode_error": err.Error()})
	return append(b, raw...)
}

// appendPy appends v in Python's form (see pyJSON): what appendJSON
// writes, turned by appendPyForm, but written in that form at once for the
// values the fake builds its messages from, without the compact text in
// between. Other values go through marshalRaw and appendPyForm.
func appendPy(b []byte, v any) ([]byte, error) {
	switch t := v.(type) {
	case omap:
		b = append(b, '{')
		for i, e := range t {
			if i > 0 {
				b = append(b, ", "...)
			}
			b = appendPyString(b, e.K)
			b = append(b, ": "...)
			var err error
			if b, err = appendPy(b, e.V); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	case []any:
		if t == nil {
			return append(b, "null"...), nil
		}
		b = append(b, '[')
		for i, e := range t {
			if i > 0 {
				b = append(b, ", "...)
			}
			var err error
			if b, err = appendPy(b, e); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case string:
		return appendPyString(b, t), nil
	case nil:
		return append(b, "null"...), nil
	case bool:
		return strconv.AppendBool(b, t), nil
	case int:
		return strconv.AppendInt(b, int64(t), 10), nil
	case int64:
		return strconv.AppendInt(b, t, 10), nil
	case pyFloat:
		return append(b, pyFloatString(float64(t))...), nil
	case rawJSON:
		return append(b, t...), nil
	}
	raw, err := marshalRaw(v)
	if err != nil {
		return nil, err
	}
	return appendPyForm(b, raw), nil
}

// appendPyObject is appendPy for an object, for a caller that has an omap:
// converted to an interface, it would cost a copy of its header. (appendPy
// repeats its loop: calling it from there made the two functions mutually
// recursive, and escape analysis then moved every caller's buffer to the
// heap.)
func appendPyObject(b []byte, m omap) ([]byte, error) {
	b = append(b, '{')
	for i, e := range m {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendPyString(b, e.K)
		b = append(b, ": "...)
		var err error
		if b, err = appendPy(b, e.V); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

// appendPyString appends s quoted in Python's form: plain printable ASCII
// as it is, anything else as marshalRaw quotes it, turned by
// appendPyForm.
func appendPyString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			raw, _ := marshalRaw(s) // a string always encodes
			return appendPyForm(b, raw)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendPyForm appends raw, JSON as marshalRaw writes it (no space
// between tokens), in Python's form: a space after every ',' and ':'
// outside strings, and every non-ASCII character of a string escaped
// (\uXXXX, a surrogate pair beyond the BMP).
func appendPyForm(out, raw []byte) []byte {
	inStr := false
	for i := 0; i < len(raw); {
		c := raw[i]
		if inStr {
			switch {
			case c == '\\':
				out = append(out, c, raw[i+1])
				i += 2
				continue
			case c == '"':
				inStr = false
			case c >= 0x80:
				r, n := utf8.DecodeRune(raw[i:])
				if r >= 0x10000 {
					r -= 0x10000
					out = fmt.Appendf(out, `\u%04x\u%04x`, 0xD800+(r>>10), 0xDC00+(r&0x3FF))
				} else {
					out = fmt.Appendf(out, `\u%04x`, r)
				}
				i += n
				continue
			}
			out = append(out, c)
			i++
			continue
		}
		out = append(out, c)
		switch c {
		case '"':
			inStr = true
		case ',', ':':
			out = append(out, ' ')
		}
		i++
	}
	return out
}

// bufPool holds encoding buffers, as *[]byte (see getBuf).
var bufPool sync.Pool

// maxPooledBuf bounds the buffers putBuf keeps: a larger one (a long
// history, say) is left to the garbage collector.
const maxPooledBuf = 64 << 10

// getBuf returns an empty buffer to encode a frame or an answer into;
// putBuf takes it back once the bytes are written. A fake that ran a
// prompt allocated each of its frames and answers, and these were most
// of its garbage.
func getBuf() *[]byte {
	if p, _ := bufPool.Get().(*[]byte); p != nil {
		return p
	}
	b := make([]byte, 0, 1024)
	return &b
}

// putBuf returns p, whose bytes nothing uses any more, to the pool.
func putBuf(p *[]byte) {
	if cap(*p) > maxPooledBuf {
		return
	}
	*p = (*p)[:0]
	bufPool.Put(p)
}

// decodeOrdered parses JSON keeping object key order: objects become omap,
// numbers json.Number, arrays []any.
func decodeOrdered(data []byte) (any, error) {
	if !json.Valid(data) {
		return nil, errors.New("comfytest: not a JSON value")
	}
	d, _ := orderedDecoders.Get().(*orderedDecoder)
	if d == nil {
		d = new(orderedDecoder)
	}
	v, _ := d.value(data)
	orderedDecoders.Put(d) // its stacks are empty again
	return v, nil
}

// orderedDecoders holds decoders whose stacks have grown, to reuse.
var orderedDecoders sync.Pool

// orderedDecoder decodes valid JSON into omap, []any, json.Number and
// the other plain values. The members of the objects and the items of
// the arrays being read wait on its stacks, so that each object or array
// is made once, of its size: as append grew them, every object of the
// prompts a fake received was copied at each doubling.
type orderedDecoder struct {
	kvs  []kv  // members of the objects being read, innermost last
	vals []any // items of the arrays being read, innermost last
}

// value decodes the first value of b, which is valid JSON (it walks the
// text without checking it), and returns the text after it. Through
// json.Decoder's tokens, every string and number cost a decoder of its
// own.
func (d *orderedDecoder) value(b []byte) (any, []byte) {
	b = jsonbytes.SkipSpace(b)
	switch b[0] {
	case '{':
		base := len(d.kvs)
		b = jsonbytes.SkipSpace(b[1:])
		for b[0] != '}' {
			k, rest := orderedString(b)
			v, rest := d.value(jsonbytes.SkipSpace(rest)[1:]) // after the ':'
			d.set(base, k, v)
			if b = jsonbytes.SkipSpace(rest); b[0] == ',' {
				b = jsonbytes.SkipSpace(b[1:])
			}
		}
		m := make(omap, len(d.kvs)-base)
		copy(m, d.kvs[base:])
		clear(d.kvs[base:])
		d.kvs = d.kvs[:base]
		return m, b[1:]
	case '[':
		base := len(d.vals)
		b = jsonbytes.SkipSpace(b[1:])
		for b[0] != ']' {
			v, rest := d.value(b)
			d.vals = append(d.vals, v)
			if b = jsonbytes.SkipSpace(rest); b[0] == ',' {
				b = jsonbytes.SkipSpace(b[1:])
			}
		}
		a := make([]any, len(d.vals)-base)
		copy(a, d.vals[base:])
		clear(d.vals[base:])
		d.vals = d.vals[:base]
		return a, b[1:]
	case '"':
		s, rest := orderedString(b)
		return s, rest
	case 't':
		return true, b[len("true"):]
	case 'f':
		return false, b[len("false"):]
	case 'n':
		return nil, b[len("null"):]
	}
	num, rest, _ := jsonbytes.CutNumber(b) // valid JSON: a number
	return json.Number(num), rest
}

// set is omap.set for the object being read, whose members are
// d.kvs[base:]: a repeated key replaces the value, in its place, as a
// map's does.
func (d *orderedDecoder) set(base int, k string, v any) {
	for i := base; i < len(d.kvs); i++ {
		if d.kvs[i].K == k {
			d.kvs[i].V = v
			return
		}
	}
	d.kvs = append(d.kvs, kv{k, v})
}

// orderedString reads the string literal at the start of b, which is
// valid JSON, and returns its text and what follows. Text without escapes
// or non-ASCII bytes is taken as it is (the keys of the protocol as
// constants); other text is unquoted by encoding/json.
func orderedString(b []byte) (string, []byte) {
	lit, plain, rest := jsonbytes.CutValidString(b)
	if plain {
		return protocolKey(lit[1 : len(lit)-1]), rest
	}
	var s string
	_ = json.Unmarshal(lit, &s) // a valid string literal
	return s, rest
}

// protocolKey returns t as a string: a constant for the keys every prompt
// sends, so that they cost no copy.
func protocolKey(t []byte) string {
	switch string(t) {
	case "prompt":
		return "prompt"
	case "class_type":
		return "class_type"
	case "inputs":
		return "inputs"
	case "_meta":
		return "_meta"
	case "title":
		return "title"
	case "client_id":
		return "client_id"
	case "prompt_id":
		return "prompt_id"
	case "extra_data":
		return "extra_data"
	case "extra_pnginfo":
		return "extra_pnginfo"
	case "number":
		return "number"
	case "front":
		return "front"
	case "partial_execution_targets":
		return "partial_execution_targets"
	}
	return string(t)
}

// rawMember returns a copy of the text of member key of the JSON object
// obj (valid JSON): the last one when the key repeats, as decoding obj
// into a map finds it. ok is false when obj is not an object or has no
// such member.
func rawMember(obj []byte, key string) (raw json.RawMessage, ok bool) {
	b := jsonbytes.SkipSpace(obj)
	if b[0] != '{' {
		return nil, false
	}
	b = jsonbytes.SkipSpace(b[1:])
	for b[0] != '}' {
		k, rest := orderedString(b) // unescaped as a map's keys are
		val := jsonbytes.SkipSpace(jsonbytes.SkipSpace(rest)[1:])
		rest = skipValue(val)
		if k == key {
			raw, ok = val[:len(val)-len(rest)], true
		}
		if b = jsonbytes.SkipSpace(rest); b[0] == ',' {
			b = jsonbytes.SkipSpace(b[1:])
		}
	}
	return bytes.Clone(raw), ok
}

// skipValue returns b after its first value (b starts with it; it is
// valid JSON).
func skipValue(b []byte) []byte {
	depth := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			for i++; b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++ // the escaped character, maybe a quote
				}
			}
		case '{', '[':
			depth++
			continue
		case '}', ']':
			depth--
		default:
			if depth > 0 {
				continue
			}
			j := i // a number or a literal
			for j < len(b) && strings.IndexByte(",}] \t\r\n", b[j]) < 0 {
				j++
			}
			return b[j:]
		}
		if depth == 0 {
			return b[i+1:]
		}
	}
	return nil
}

// toPlain converts an ordered value into plain Go maps/slices (for
// ReceivedPrompt.ExtraData).
func toPlain(v any) any {
	switch t := v.(type) {
	case omap:
		m := make(map[string]any, len(t))
		for _, e := range t {
			m[e.K] = toPlain(e.V)
		}
		return m
	case []any:
		a := make([]any, len(t))
		for i, e := range t {
			a[i] = toPlain(e)
		}
		return a
	case json.Number:
		if f, err := t.Float64(); err == nil {
			return f
		}
		return t.String()
	default:
		return v
	}
}

// pyStr renders a JSON scalar the way Python's str() would.
func pyStr(v any) string {
	switch t := v.(type) {
	case nil:
		return "None"
	case bool:
		if t {
			return "True"
		}
		return "False"
	case string:
		return t
	case json.Number:
		return t.String()
	case pyFloat:
		return pyFloatString(float64(t))
	case int:
		return strconv.Itoa(t)
	case int64:
		return strconv.FormatInt(t, 10)
	case float64:
		return pyFloatString(t)
	default:
		b, _ := json.Marshal(t)
		return string(b)
	}
}

// pyRepr renders a value the way Python's repr() would (strings quoted).
func pyRepr(v any) string {
	if s, ok := v.(string); ok {
		return "'" + s + "'"
	}
	return pyStr(v)
}
