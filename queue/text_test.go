package queue_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"

	"github.com/comfypool/comfypool/queue"
)

// storable is Storable's definition, written the plain way.
func storable(s string) bool { return utf8.ValidString(s) && !strings.Contains(s, "\x00") }

// Storable agrees with its definition on ASCII, on text with runes of
// every length, and on every place a NUL or a broken sequence can be:
// before, at and after the first byte that is not ASCII.
func TestStorable(t *testing.T) {
	for _, s := range []string{
		"", "a", "class:KSampler", "\x00", "a\x00", "\x00a", "é", "aé", "éa", "é\x00", "a\x00é", "aé\x00",
		"\xff", "a\xff", "\xffa", "é\xff", "\xc3", "a\xc3", "日本語", "𝄞", "ok\xed\xa0\x80", "\xef\xbf\xbd",
		strings.Repeat("x", 100) + "\x00", strings.Repeat("é", 50) + "\x00x",
	} {
		assert.Equal(t, storable(s), queue.Storable(s), "%q", s)
	}
}

func FuzzStorable(f *testing.F) {
	for _, s := range []string{"", "abc", "a\x00", "é", "\xff", "aé\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := queue.Storable(s), storable(s); got != want {
			t.Fatalf("Storable(%q) = %v, want %v", s, got, want)
		}
	})
}
