package files

import (
	"strings"
	"unicode/utf8"
)

// MaxKeyLen is the longest key in bytes, S3's limit.
const MaxKeyLen = 1024

// reservedPrefix is the first key segment the Store keeps for itself
// (staging objects of PutContentAddressed); users cannot write under it.
const reservedPrefix = ".files/"

// ValidateKey reports whether key may name an object. A key is a relative,
// slash-separated path of valid UTF-8, at most [MaxKeyLen] bytes, with no
// empty, "." or ".." segment, no leading or trailing slash, no backslash,
// no NUL or other control character, no Windows drive letter, and not under
// the reserved prefix ".files/". Every store accepts the same keys, so a
// key that works on disk works on S3. The error is a [*KeyError] matching
// [ErrInvalidKey].
func ValidateKey(key string) error {
	bad := func(reason string) error { return &KeyError{Key: key, Reason: reason} }
	switch {
	case key == "":
		return bad("is empty")
	case len(key) > MaxKeyLen:
		return bad("is longer than 1024 bytes")
	case !utf8.ValidString(key):
		return bad("is not valid UTF-8")
	case strings.IndexByte(key, 0) >= 0:
		return bad("contains NUL")
	case strings.ContainsFunc(key, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return bad("contains a control character")
	case strings.IndexByte(key, '\\') >= 0:
		return bad("contains a backslash")
	case key[0] == '/':
		return bad("is absolute")
	case len(key) >= 2 && key[1] == ':' && isASCIILetter(key[0]):
		return bad("starts with a drive letter")
	case strings.HasSuffix(key, "/"):
		return bad("ends with a slash")
	case strings.HasPrefix(key, reservedPrefix):
		return bad("is under the reserved prefix " + reservedPrefix)
	}
	for seg := range strings.SplitSeq(key, "/") {
		switch seg {
		case "":
			return bad("contains an empty segment")
		case ".", "..":
			return bad(`contains a "` + seg + `" segment`)
		}
	}
	return nil
}

func isASCIILetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
