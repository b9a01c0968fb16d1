package comfy

import (
	"bytes"
	"encoding/json"
	"slices"

	"github.com/comfypool/comfypool/internal/jsonbytes"
)

// Files returns the file records in the output: every item of every kind's
// list that is an object with a string "filename", kinds sorted by name.
// Items that are not file records (the "animated" bools, "text" strings)
// are skipped.
func (o Output) Files() []FileRef {
	var buf [4]FileRef // most outputs: one file
	out := o.appendFiles(buf[:0])
	if len(out) == 0 {
		return nil
	}
	return slices.Clone(out)
}

// appendFiles appends the output's files (see Files) to out.
func (o Output) appendFiles(out []FileRef) []FileRef {
	if len(o) == 1 { // most outputs: nothing to sort
		for _, kind := range o {
			return appendKindFiles(out, kind)
		}
	}
	var buf [8]string
	kinds := buf[:0]
	for k := range o {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		out = appendKindFiles(out, o[k])
	}
	return out
}

// appendKindFiles appends to out the file records of kind, an output
// kind's raw JSON, and returns the extended slice. It gives what
// encoding/json gives for kind decoded into a list of
//
//	struct {
//		Filename  *string `json:"filename"`
//		Subfolder any     `json:"subfolder"`
//		Type      any     `json:"type"`
//	}
//
// (item by item when the list as a whole fails), without reflection: the
// items, in list order, that are objects whose "filename" is a string,
// with their subfolder and type when those are strings, else "". As
// encoding/json does, it matches keys case-insensitively (bytes.EqualFold),
// lets the last of a repeated key win, and skips an item whose decode
// fails: one with a filename that is neither a string nor null, or with a
// subfolder or type holding a number beyond float64. It appends nothing
// when kind is not a list, or not valid JSON. Kind is read in one pass
// that checks JSON's grammar as it goes; text that needs no unescaping is
// copied as it is, other text unescaped by encoding/json.
func appendKindFiles(out []FileRef, kind []byte) []FileRef {
	n := len(out)
	rest := jsonbytes.SkipSpace(kind)
	if len(rest) == 0 || rest[0] != '[' {
		return out // not a list, valid or not: no files
	}
	rest = jsonbytes.SkipSpace(rest[1:])
	more := len(rest) == 0 || rest[0] != ']'
	if !more {
		rest = rest[1:]
	}
	for ok := true; more; {
		if len(rest) > 0 && rest[0] == '{' {
			var f FileRef
			var file bool
			if f, file, rest, ok = cutFileRecord(rest); ok && file {
				out = append(out, f)
			}
		} else {
			_, rest, ok = cutAnyValue(rest)
		}
		if ok {
			rest, more, ok = cutNext(rest, ']')
		}
		if !ok {
			return out[:n]
		}
	}
	if len(jsonbytes.SkipSpace(rest)) != 0 {
		return out[:n]
	}
	// The reader checks each value on its own; encoding/json also refuses
	// JSON nested more than 10 000 deep, which only text as long can be.
	if len(kind) > 10000 && !json.Valid(kind) {
		return out[:n]
	}
	return out
}

// cutFileRecord reads the object at the start of b, an item of an output
// kind's list (see appendKindFiles), and returns the file record it holds
// and what follows it. file is false for an object that holds none; ok is
// false when b does not start with a valid JSON object.
func cutFileRecord(b []byte) (f FileRef, file bool, rest []byte, ok bool) {
	var name, sub, typ ipValue // the last of each
	bad := false               // a value encoding/json fails to decode
	rest = jsonbytes.SkipSpace(b[1:])
	more := len(rest) == 0 || rest[0] != '}'
	if !more {
		rest = rest[1:]
	}
	for more {
		var key []byte
		var v ipValue
		if key, rest, ok = cutString(rest); !ok {
			return f, false, nil, false
		}
		if rest = jsonbytes.SkipSpace(rest); len(rest) == 0 || rest[0] != ':' {
			return f, false, nil, false
		}
		if v, rest, ok = cutAnyValue(jsonbytes.SkipSpace(rest[1:])); !ok {
			return f, false, nil, false
		}
		switch fileField(key) {
		case 'f':
			name = v
			bad = bad || v.kind != '"' && v.kind != 'n'
		case 's':
			sub = v
			bad = bad || !decodesAsAny(v)
		case 't':
			typ = v
			bad = bad || !decodesAsAny(v)
		}
		if rest, more, ok = cutNext(rest, '}'); !ok {
			return f, false, nil, false
		}
	}
	if bad || name.kind != '"' {
		return f, false, rest, true
	}
	f = FileRef{Filename: string(name.text), Subfolder: stringOf(sub), Type: fileTypeOf(typ)}
	return f, true, rest, true
}

// fileField names the field of a file record that key sets: 'f'
// (filename), 's' (subfolder), 't' (type), or 0 for none. Keys match
// case-insensitively, as encoding/json matches them to struct fields.
func fileField(key []byte) byte {
	switch string(key) {
	case "filename":
		return 'f'
	case "subfolder":
		return 's'
	case "type":
		return 't'
	}
	switch {
	case bytes.EqualFold(key, []byte("filename")):
		return 'f'
	case bytes.EqualFold(key, []byte("subfolder")):
		return 's'
	case bytes.EqualFold(key, []byte("type")):
		return 't'
	}
	return 0
}

// decodesAsAny reports whether encoding/json decodes v into an any
// without error: it fails on a number beyond float64, alone or inside an
// object or array.
func decodesAsAny(v ipValue) bool {
	switch v.kind {
	case '0', '[', '{':
		var x any
		return json.Unmarshal(v.raw, &x) == nil
	}
	return true
}

// stringOf is v's text when v is a string, else "".
func stringOf(v ipValue) string {
	if v.kind != '"' {
		return ""
	}
	return string(v.text)
}

// fileTypeOf is stringOf(v), the usual file types without a copy.
func fileTypeOf(v ipValue) string {
	if v.kind != '"' {
		return ""
	}
	switch string(v.text) {
	case "output":
		return "output"
	case "temp":
		return "temp"
	case "input":
		return "input"
	}
	return string(v.text)
}

// cutNext reads what follows a value inside an array or an object whose
// closing bracket is end: a comma, after which more is true and rest is
// the next value (or key), or end, after which more is false. ok is false
// for anything else.
func cutNext(b []byte, end byte) (rest []byte, more, ok bool) {
	b = jsonbytes.SkipSpace(b)
	switch {
	case len(b) == 0:
		return nil, false, false
	case b[0] == ',':
		return jsonbytes.SkipSpace(b[1:]), true, true
	case b[0] == end:
		return b[1:], false, true
	}
	return nil, false, false
}

// cutAnyValue is cutValue for any valid JSON value: a string that needs
// unescaping is unescaped (see cutString), its text new bytes.
func cutAnyValue(b []byte) (v ipValue, rest []byte, ok bool) {
	if v, rest, ok = cutValue(b); ok || len(b) == 0 || b[0] != '"' {
		return v, rest, ok
	}
	text, rest, ok := cutString(b)
	return ipValue{kind: '"', raw: b[:len(b)-len(rest)], text: text}, rest, ok
}

// cutString reads the JSON string at the start of b and returns its text
// and what follows; ok is false when b does not start with a valid
// string. Text that needs no unescaping (see cutPlainString) is b's own
// bytes; other text is unescaped by encoding/json, into new bytes.
func cutString(b []byte) (text, rest []byte, ok bool) {
	if text, rest, ok = cutPlainString(b); ok || len(b) == 0 || b[0] != '"' {
		return text, rest, ok
	}
	i := 1
	for ; i < len(b) && b[i] != '"'; i++ {
		if b[i] == '\\' {
			i++ // the escaped character, maybe a quote
		}
	}
	if i >= len(b) {
		return nil, nil, false
	}
	var s string
	if json.Unmarshal(b[:i+1], &s) != nil {
		return nil, nil, false
	}
	return []byte(s), b[i+1:], true
}
