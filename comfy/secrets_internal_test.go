package comfy

import (
	"encoding/base64"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestScrubEncodings lists the forms a credential takes in a body or an
// error message; each must become REDACTED, and text around it must stay.
func TestScrubEncodings(t *testing.T) {
	t.Parallel()
	const sec = "tok&S/e+c r=é<t\"x"
	s := newScrubber(sec, "alice:pw-9")
	for name, enc := range map[string]string{
		"raw":                 sec,
		"JSON with \\u0026":   `tok\u0026S/e+c r=\u00e9\u003ct\"x`,
		"JSON upper-case hex": `tok\u0026S\/e+c r=\u00E9\u003Ct\"x`,
		"JSON escaped twice":  `tok\\u0026S\\/e+c r=\\u00e9\\u003ct\\\"x`,
		"URL query":           "tok%26S%2Fe%2Bc+r%3D%C3%A9%3Ct%22x",
		"URL lower-case hex":  "tok%26S%2fe%2bc%20r%3d%c3%a9%3ct%22x",
		"URL encoded twice":   "tok%2526S%252Fe%252Bc%2Br%253D%25C3%25A9%253Ct%2522x",
		"HTML":                "tok&amp;S&#x2F;e+c r=é&lt;t&quot;x",
		"Python bytes repr":   `tok\x26S/e+c r=\xc3\xa9<t"x`,
		"Python str repr":     `tok&S/e+c r=\xe9<t\"x`,
		"mixed":               `tok%26S\/e+c+r&#61;\u00e9<t"x`,
		"base64":              base64.StdEncoding.EncodeToString([]byte(sec)),
		"base64 URL, no pad":  base64.RawURLEncoding.EncodeToString([]byte(sec)),
		"basic auth base64":   base64.StdEncoding.EncodeToString([]byte("alice:pw-9")),
		"truncated, 8+ chars": "tok&S/e+",
		"truncated, escaped":  `tok\u0026S\/e+c`,
	} {
		got := s.scrub("before " + enc + "| after")
		assert.Equal(t, "before REDACTED| after", got, name)
	}
	// Astral characters escaped as a surrogate pair.
	s2 := newScrubber("key-😀-end")
	assert.Equal(t, "[REDACTED]", s2.scrub(`[key-\ud83d\ude00-end]`))

	// Not credentials: left alone.
	for _, text := range []string{"", "tok&S/e", "plain text", `\u00`, "%zz", "&#;", "tok"} {
		assert.Equal(t, text, s.scrub(text))
	}
	assert.Equal(t, "short", newScrubber("ab").scrub("short"), "credentials under 3 characters are not scrubbed")
	var none *scrubber
	assert.Equal(t, "x", none.scrub("x"))
}

func TestScrubCutStraddling(t *testing.T) {
	t.Parallel()
	const sec = "straddling-secret-value"
	s := newScrubber(sec)
	for before := 1; before < len(sec); before++ {
		text := fmt.Sprintf("%s%s%s", string(make([]byte, 100-before)), sec, "tail")
		got := s.scrubCut(text, 100)
		assert.LessOrEqual(t, len(got), 100)
		assert.NotContains(t, got, sec[:min(before, 8)], "before=%d", before)
	}
}

func TestRedactKeepsCleanCauses(t *testing.T) {
	t.Parallel()
	s := newScrubber("sekrit-token")
	clean := errors.New("clean cause")
	dirty := fmt.Errorf("GET /x?token=sekrit-token: %w", clean)
	got := s.redact(fmt.Errorf("wrap: %w", dirty), "")
	assert.Equal(t, "wrap: GET /x?token=REDACTED: clean cause", got.Error())
	assert.ErrorIs(t, got, clean)
	assert.NotErrorIs(t, got, dirty)
	joined := errors.Join(clean, errors.New("sekrit-token"))
	got = s.redact(joined, "")
	assert.ErrorIs(t, got, clean)
	assert.NotContains(t, fmt.Sprintf("%v %+v", got, errors.Unwrap(got)), "sekrit")
	assert.Same(t, clean, s.redact(clean, ""), "a clean error is returned as is")
}
