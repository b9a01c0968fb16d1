package hash

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"unicode/utf8"
)

// exactDomain prefixes the canonical JSON hashed by Exact. Changing the
// canonical form requires a new version.
const exactDomain = "comfypool/exact/v1\x00"

// Exact returns the exact hash of an API-format workflow: SHA-256 over a
// canonical JSON encoding of the whole document, so every value counts
// (node ids, seeds, prompts, _meta titles, unknown keys) while key order,
// whitespace, string escaping and number spelling do not.
//
// The canonical encoding is: objects with keys sorted by their UTF-8 bytes,
// arrays in order, no whitespace, strings as their decoded Unicode text with
// only '"', '\' and control characters escaped, and numbers in the exact
// canonical form described in the package documentation (1, 1.0 and 1e0 are
// equal; 18446744073709551615 and 18446744073709551614 differ). If an object
// repeats a key, the last value wins, as in ComfyUI's own JSON decoding.
//
// Exact requires a non-empty JSON object in valid UTF-8 and nothing after it;
// it does not check nodes or links (use [Structure] for that). Errors wrap
// [ErrInvalidWorkflow]. Exact is safe for concurrent use.
func Exact(workflow []byte) (Sum, error) {
	v, err := decodeExact(workflow)
	if err != nil {
		return Sum{}, err
	}
	buf := make([]byte, 0, len(exactDomain)+len(workflow))
	buf = append(buf, exactDomain...)
	buf = appendCanonical(buf, v)
	return sha256.Sum256(buf), nil
}

// ExactOf marshals v with [encoding/json] and returns [Exact] of the result.
// Use it for a workflow held as a map or struct; pass JSON bytes to [Exact]
// directly (a []byte given to ExactOf would be marshalled as a base64
// string, which is not a workflow). Marshal errors are returned wrapped in
// [ErrInvalidWorkflow].
func ExactOf(v any) (Sum, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return Sum{}, fmt.Errorf("%w: marshal: %w", ErrInvalidWorkflow, err)
	}
	return Exact(data)
}

// decodeExact decodes the workflow with json.Number for numbers and checks
// the document rules shared by Exact.
func decodeExact(workflow []byte) (map[string]any, error) {
	if !utf8.Valid(workflow) {
		return nil, fmt.Errorf("%w: not valid UTF-8", ErrInvalidWorkflow)
	}
	dec := json.NewDecoder(bytes.NewReader(workflow))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: empty input", ErrInvalidWorkflow)
		}
		return nil, fmt.Errorf("%w: %w", ErrInvalidWorkflow, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: trailing data after the workflow object", ErrInvalidWorkflow)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%w: top level is %s, want an object of nodes", ErrInvalidWorkflow, jsonKind(v))
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("%w: workflow has no nodes", ErrInvalidWorkflow)
	}
	return m, nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	default:
		return "an object"
	}
}

// appendCanonical appends the canonical JSON encoding of v, a value decoded
// with UseNumber. Nesting depth is bounded by encoding/json's decoder limit.
func appendCanonical(dst []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(dst, "null"...)
	case bool:
		if v {
			return append(dst, "true"...)
		}
		return append(dst, "false"...)
	case json.Number:
		return appendCanonicalNumber(dst, string(v))
	case string:
		return appendString(dst, v)
	case []any:
		dst = append(dst, '[')
		for i, e := range v {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendCanonical(dst, e)
		}
		return append(dst, ']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		dst = append(dst, '{')
		for i, k := range keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, k)
			dst = append(dst, ':')
			dst = appendCanonical(dst, v[k])
		}
		return append(dst, '}')
	default:
		// Unreachable: the decoder produces only the types above.
		panic(fmt.Sprintf("hash: unexpected decoded type %T", v))
	}
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string, escaping only '"', '\' and
// control characters below U+0020 (as \u00XX), so the encoding of a given
// Unicode string is unique.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
