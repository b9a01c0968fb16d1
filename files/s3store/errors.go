package s3store

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/minio/minio-go/v7"

	"github.com/comfypool/comfypool/files"
)

// ErrInvalid is wrapped by every configuration error of [New]; the message
// names the field and the rule.
var ErrInvalid = errors.New("s3store: invalid configuration")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// wrap turns a client error into the driver's: a missing object wraps
// files.ErrNotFound; every message is scrubbed of the credentials.
func (d *Driver) wrap(op string, err error) error {
	switch minio.ToErrorResponse(err).Code {
	case "NoSuchKey", "NotFound":
		return fmt.Errorf("s3store: %s: %w", op, files.ErrNotFound)
	}
	msg := fmt.Sprintf("s3store: %s: %v", op, err)
	return &redactedError{msg: scrub(msg, d.secrets), err: err}
}

// redactedError keeps the cause for errors.Is and errors.As (a
// minio.ErrorResponse, a *url.Error) while its message has no secret.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// secretForms lists the secrets and the encodings they might be quoted in.
func secretForms(secrets ...string) []string {
	var out []string
	for _, s := range secrets {
		if len(s) < 4 {
			continue
		}
		out = append(out, s, url.QueryEscape(s), url.PathEscape(s),
			base64.StdEncoding.EncodeToString([]byte(s)), base64.URLEncoding.EncodeToString([]byte(s)))
	}
	return out
}

func scrub(s string, secrets []string) string {
	for _, sec := range secrets {
		s = strings.ReplaceAll(s, sec, "REDACTED")
	}
	return s
}
