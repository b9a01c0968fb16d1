package queue

import (
	"strings"
	"unicode/utf8"
)

// Text. Every driver stores a job's names, keys and messages as text (a
// PostgreSQL text or jsonb column, a JSON field in Redis), and the pool's
// records and events marshal them to JSON. Text that is not valid UTF-8,
// or holds NUL, cannot go through all of these unchanged: PostgreSQL
// refuses it, and encoding/json replaces the bytes. So the Queue refuses
// it where a caller wrote it (EnqueueParams, a lessee's names), and
// cleans it where a server did (an error's text, a prompt ID), so that
// every driver stores the same thing and a failure is never lost for its
// text.

// Storable reports whether every driver can store s as text: it is
// valid UTF-8 and holds no NUL. A job's text fields must be (see
// [Driver]); the pool checks its options with it.
func Storable(s string) bool {
	// One pass over the ASCII that names and keys nearly always are; the
	// rest, from the first byte that is not, the long way.
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == 0:
			return false
		case c >= utf8.RuneSelf:
			return utf8.ValidString(s[i:]) && strings.IndexByte(s[i:], 0) < 0
		}
	}
	return true
}

// checkText returns an error wrapping ErrInvalid, naming field, if s is
// not Storable.
func checkText(field, s string) error {
	if !Storable(s) {
		return invalidf("%s is not text every queue can store (valid UTF-8 without NUL): %q", field, s)
	}
	return nil
}

// checkTexts is checkText for each element of s.
func checkTexts(field string, s []string) error {
	for _, v := range s {
		if err := checkText(field, v); err != nil {
			return err
		}
	}
	return nil
}

// cleanText returns s with each run of bytes that are not UTF-8 replaced
// by U+FFFD and NUL removed; s itself when it is valid text.
func cleanText(s string) string {
	if Storable(s) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
}

// clean returns the summary with each field cleaned (cleanText).
func (s ErrorSummary) clean() ErrorSummary {
	return ErrorSummary{
		Class: cleanText(s.Class), Message: cleanText(s.Message), NodeID: cleanText(s.NodeID), NodeType: cleanText(s.NodeType),
	}
}
