package s3store_test

import (
	"testing"

	"github.com/comfypool/comfypool/files"
	"github.com/comfypool/comfypool/files/filestest"
	"github.com/comfypool/comfypool/files/s3store"
)

func (g *gateway) config(t *testing.T) *s3store.Config {
	t.Helper()
	return &s3store.Config{
		Endpoint:        g.endpoint,
		Bucket:          g.newBucket(t),
		AccessKeyID:     g.access,
		SecretAccessKey: g.secret,
	}
}

// TestS3 runs the conformance suite against a real S3-compatible server
// (versitygw, a separate process) and the S3-specific checks. The suite's
// expiry subtest is skipped (the server checks expiry on real time);
// TestS3/PresignedURLExpires covers it. It does not call t.Parallel: the
// suite's large-body subtest measures the process's allocations.
func TestS3(t *testing.T) {
	g := startGateway(t)
	t.Run("Conformance", func(t *testing.T) {
		filestest.RunConformanceTests(t, filestest.Harness{
			NewDriver: func(t *testing.T) files.Driver {
				d, err := s3store.New(g.config(t))
				if err != nil {
					t.Fatal(err)
				}
				return d
			},
		})
	})
	for _, tc := range s3Tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, g)
		})
	}
}

// s3Test is an S3-specific check run against TestS3's gateway.
type s3Test struct {
	name string
	fn   func(t *testing.T, g *gateway)
}

var s3Tests []s3Test
