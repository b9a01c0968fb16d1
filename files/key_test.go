package files_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/comfypool/comfypool/files"
)

func TestValidateKey(t *testing.T) {
	t.Parallel()
	for _, key := range []string{
		"a", "a/b/c.png", "jobs/42/ComfyUI_00001_.png", "ünï cødé/+%25 (1)?#.png", ".hidden", "a/.b/c",
		"a..b", "...", "files/x", "_files/x", strings.Repeat("k", files.MaxKeyLen),
	} {
		if err := files.ValidateKey(key); err != nil {
			t.Errorf("ValidateKey(%q) = %v, want nil", key, err)
		}
	}
	for key, reason := range map[string]string{
		"":                                     "is empty",
		"/etc/passwd":                          "is absolute",
		"../x":                                 `contains a ".." segment`,
		"a/../../x":                            `contains a ".." segment`,
		"a/..":                                 `contains a ".." segment`,
		"./x":                                  `contains a "." segment`,
		"a//b":                                 "contains an empty segment",
		"a/":                                   "ends with a slash",
		`a\b`:                                  "contains a backslash",
		`..\..\x`:                              "contains a backslash",
		"a\x00b":                               "contains NUL",
		"a\rb":                                 "contains a control character",
		"a\x7fb":                               "contains a control character",
		"C:/Windows":                           "starts with a drive letter",
		"c:x":                                  "starts with a drive letter",
		".files/staging/1":                     "is under the reserved prefix .files/",
		"\xff":                                 "is not valid UTF-8",
		strings.Repeat("k", files.MaxKeyLen+1): "is longer than 1024 bytes",
	} {
		err := files.ValidateKey(key)
		var ke *files.KeyError
		if !errors.Is(err, files.ErrInvalidKey) || !errors.As(err, &ke) || ke.Key != key || ke.Reason != reason {
			t.Errorf("ValidateKey(%q) = %#v, want a KeyError %q", key, err, reason)
		}
	}
	// The message quotes the key, so a NUL or a newline cannot forge a log line.
	if got := files.ValidateKey("a\x00\nb").Error(); got != `files: invalid key "a\x00\nb": contains NUL` {
		t.Errorf("error message %q", got)
	}
}
